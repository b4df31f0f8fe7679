"""The shared models-preset file: each changed section kept beside it, listed and put back byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.errors import UserError
from tuner.output.preset import (
    history_lines,
    history_path,
    merge_preset,
    merge_sections,
    read_history,
    rollback,
)

ROOT = Path(__file__).resolve().parent.parent
ORIGINAL = (
    "version = 1\n; the operator's note: keep [*] small\n\n[*]\nc = 8192\n\n"
    "[demo]\n; tuner export: study demo, trial 3 (max-tps)\nmodel = /m/t.gguf ; mine\n\n\n"
    "[hand-written]  ; mine too\nmodel = /m/x.gguf\n"
)


@pytest.fixture
def preset(tmp_path: Path) -> Path:
    path = tmp_path / "models-preset.ini"
    path.write_text(ORIGINAL)
    return path


def export_twice(path: Path) -> None:
    merge_preset(
        path, "demo", ["[demo]", "; tuner export: study demo, trial 7 (knee)", "model = a"], "demo", 7
    )
    merge_preset(
        path, "demo", ["[demo]", "; tuner export: study demo, trial 9 (knee)", "model = b"], "demo", 9
    )


def test_a_rollback_restores_the_original_bytes_and_can_itself_be_undone(preset: Path) -> None:
    export_twice(preset)
    after_second = preset.read_bytes()
    assert "model = b" in preset.read_text() and preset.read_text().endswith(
        "[hand-written]  ; mine too\nmodel = /m/x.gguf\n"
    )
    target, kept = rollback(preset, "demo", to=1)
    assert preset.read_bytes() == ORIGINAL.encode() and (target.number, kept.number) == (1, 3)
    assert kept.replaced_by == "rollback to 1" and kept.study is None
    rollback(preset, "demo")  # the latest version: the one the rollback kept
    assert preset.read_bytes() == after_second


def test_the_default_rollback_is_the_latest_version_and_to_picks_another(preset: Path) -> None:
    export_twice(preset)
    rollback(preset, "demo")
    assert "model = a" in preset.read_text() and "model = b" not in preset.read_text()
    rollback(preset, "demo", to=1)
    assert preset.read_text() == ORIGINAL
    assert [v.replaced_by for v in read_history(preset)] == [
        "export",
        "export",
        "rollback to 2",
        "rollback to 1",
    ]


def test_history_lists_number_time_section_and_the_export_that_replaced_each_version(preset: Path) -> None:
    export_twice(preset)
    merge_sections(preset, {"demo-code": ["[demo-code]", "model = c"]}, {"demo-code": ("demo", 11)})
    versions = read_history(preset)
    assert [(v.number, v.section, v.study, v.trial) for v in versions] == [
        (1, "demo", "demo", 7),
        (2, "demo", "demo", 9),
        (3, "demo-code", "demo", 11),
    ]
    assert (
        versions[0].text
        == "[demo]\n; tuner export: study demo, trial 3 (max-tps)\nmodel = /m/t.gguf ; mine\n\n\n"
    )
    assert versions[2].text is None and all(v.time.endswith("Z") and "T" in v.time for v in versions)
    lines = history_lines(preset)
    assert lines[0].startswith(f"{preset}: 3 kept version(s), oldest first")
    assert lines[1].split() == ["N", "time", "(UTC)", "section", "replaced", "by", "it", "held"]
    assert "export of study demo, trial 7" in lines[2] and lines[2].endswith("study demo, trial 3")
    assert lines[4].endswith("(no such section)")
    only = history_lines(preset, "demo-code")
    assert len(only) == 3 and only[2].startswith("3 ")
    assert json.loads(history_path(preset).read_text().splitlines()[0])["section"] == "demo"


def test_an_unchanged_section_keeps_no_version(preset: Path) -> None:
    export_twice(preset)
    merge_preset(
        preset, "demo", ["[demo]", "; tuner export: study demo, trial 9 (knee)", "model = b"], "demo", 9
    )
    assert len(read_history(preset)) == 2


def test_rolling_back_a_section_that_did_not_exist_removes_it_cleanly(preset: Path) -> None:
    merge_sections(
        preset,
        {"demo-c4": ["[demo-c4]", "model = c4"], "demo-code": ["[demo-code]", "model = code"]},
        {"demo-c4": ("demo", 4), "demo-code": ("demo", 5)},
    )
    rollback(preset, "demo-code")
    rollback(preset, "demo-c4")
    assert preset.read_bytes() == ORIGINAL.encode()
    rollback(preset, "demo-c4")  # undone: it is back, as it was
    assert preset.read_text() == ORIGINAL + "\n[demo-c4]\nmodel = c4\n"


def test_removing_a_section_keeps_the_line_end_of_the_one_before(tmp_path: Path) -> None:
    path = tmp_path / "models-preset.ini"
    path.write_text("version = 1\n\n[a]\nmodel = x\n")
    merge_preset(path, "a", ["[a]", "model = y"])
    merge_preset(path, "new", ["[new]", "model = z"])  # a blank line added after [a]
    rollback(path, "a")  # [a] as it was: the blank line goes with the text it replaced
    rollback(path, "new")
    assert path.read_text() == "version = 1\n\n[a]\nmodel = x\n"


def test_rolling_back_the_only_export_into_a_file_without_a_header_gives_the_file_back(
    tmp_path: Path,
) -> None:
    """Issue 49: the [demo] section came back byte for byte, the `version = 1` line and the comment the export put
    above a header-less file stayed."""
    path = tmp_path / "models-preset.ini"
    original = "[*]\nc = 8192\n\n[demo]\nmodel = /m/mine.gguf ; hand-tuned\n"  # two sections, no header
    path.write_text(original)
    merge_preset(
        path, "demo", ["[demo]", "; tuner export: study demo, trial 7 (knee)", "model = a"], "demo", 7
    )
    exported = path.read_bytes()
    assert exported.startswith(b"version = 1\n") and b"model = a" in exported
    target, kept = rollback(path, "demo")
    assert path.read_bytes() == original.encode() and target.preamble == ""
    rollback(path, "demo")  # undone: the header comes back with the export's section
    assert path.read_bytes() == exported


def test_the_header_stays_while_another_export_is_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "models-preset.ini"
    path.write_text("; my presets\n[*]\nc = 8192\n\n[demo]\nmodel = /m/mine.gguf\n")
    merge_sections(path, {"demo": ["[demo]", "model = a"], "demo-code": ["[demo-code]", "model = c"]})
    rollback(path, "demo")
    assert path.read_text().startswith("version = 1\n") and "[demo-code]" in path.read_text()
    rollback(path, "demo-code")
    assert path.read_text() == "; my presets\n[*]\nc = 8192\n\n[demo]\nmodel = /m/mine.gguf\n"


def test_a_section_removed_by_hand_is_put_back_at_the_end(preset: Path) -> None:
    merge_preset(preset, "other", ["[other]", "model = o"])
    merge_preset(preset, "other", ["[other]", "model = o2"])
    preset.write_text(preset.read_text().replace("[other]\nmodel = o2\n", ""))
    assert rollback(preset, "other", to=1)[1] is None  # it did not exist then, nor does it now
    rollback(preset, "other")
    assert preset.read_text().endswith("model = /m/x.gguf\n\n[other]\nmodel = o\n")
    assert len(read_history(preset)) == 3


def test_two_exports_at_once_keep_every_section_and_every_version(tmp_path: Path) -> None:
    path = tmp_path / "models-preset.ini"

    def export(prefix: str) -> None:
        for i in range(8):
            merge_preset(path, f"{prefix}{i}", [f"[{prefix}{i}]", f"model = /m/{prefix}{i}.gguf"], prefix, i)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(export, ["a", "b"]))
    text = path.read_text()
    assert all(f"[{p}{i}]" in text for p in "ab" for i in range(8))
    assert sorted(v.section for v in read_history(path)) == sorted(f"{p}{i}" for p in "ab" for i in range(8))


def test_a_failed_preset_write_keeps_no_version_of_a_change_that_was_not_made(
    preset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from tuner.output import files

    export_twice(preset)
    before, history = preset.read_bytes(), history_path(preset).read_bytes()
    real = files.os.replace

    def full(src: str, dst: str) -> None:
        if Path(dst) == preset:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(files.os, "replace", full)
    with pytest.raises(UserError, match="cannot write"):
        merge_preset(preset, "demo", ["[demo]", "model = z"])
    assert preset.read_bytes() == before and history_path(preset).read_bytes() == history


def test_bad_names_and_numbers_are_one_line_errors(
    preset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export_twice(preset)
    cases = [
        (
            ["rollback", str(preset), "nope"],
            f"{preset}: no kept version of section [nope]; the sections with kept versions are demo",
        ),
        (["rollback", str(preset), "demo", "--to", "5"], f"--to 5: {preset} has kept versions 1 to 2; "),
        (["history", str(preset), "nope"], f"{preset}: no kept version of section [nope]"),
        (["history", str(tmp_path / "gone.ini")], f"{tmp_path / 'gone.ini'}: no such preset file; "),
    ]
    for argv, message in cases:
        assert main(["preset", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"tuner preset: error: {message}") and err.count("\n") == 1, err
    merge_preset(preset, "other", ["[other]", "model = o"])
    with pytest.raises(UserError, match=r"--to 1: version 1 of .* is of section \[demo\], not \[other\]"):
        rollback(preset, "other", to=1)
    assert not (tmp_path / "gone.ini").exists()


def test_the_command_lists_and_rolls_back(preset: Path) -> None:
    export_twice(preset)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def tuner(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "tuner.cli", "preset", *argv], env=env, capture_output=True, text=True
        )

    listed = tuner("history", str(preset), "demo")
    assert listed.returncode == 0 and "export of study demo, trial 9" in listed.stdout
    done = tuner("rollback", str(preset), "demo", "--to", "1")
    assert done.returncode == 0 and preset.read_text() == ORIGINAL
    assert done.stdout.startswith(f"{preset}: [demo] put back as version 1 kept it (")
    assert f"kept as version 3: `tuner preset rollback {preset} demo` undoes this" in done.stdout
    bad = tuner("rollback", str(preset), "nope")
    assert (
        bad.returncode == 2
        and bad.stderr.count("\n") == 1
        and "no kept version of section [nope]" in bad.stderr
    )
