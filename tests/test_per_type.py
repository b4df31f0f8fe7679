"""Per-content-type winners (issue 15): the split, the held-out race, the per-type export and the router.

The split, the classifier and the preset merge are pure; a study on the stand-in server (whose
prose prompts draft badly at long K) exercises the held-out race and the export end to end;
the real pinned llama-server in router mode serves an exported preset on the synthetic family.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import running_llama_processes
from fake_llama_server import get_json, stop_group, wait_for, wait_for_json, write_study

from tuner.cli import main
from tuner.decisions.per_type import PerTypeResult, tuning_rate
from tuner.decisions.route import accuracy, content_type, request_type
from tuner.knobs.config import TrialConfig
from tuner.machine.llama_build import binary
from tuner.machine.roofline import Bandwidth
from tuner.measurement.launch import ServerCommand
from tuner.measurement.server_process import free_port
from tuner.measurement.workload import BUILTIN_SUITES, Prompt, Workload, load_workload, split
from tuner.output.analysis import report_data
from tuner.output.export import Export, merge_sections, write_export
from tuner.output.report_html import render
from tuner.paths import models_dir
from tuner.progress import Progress
from tuner.run.study_loop import run_study
from tuner.storage import store
from tuner.storage.records import TrialRecord
from tuner.studyfile.spec import load_spec

# ------------------------------------------------------------------ the split


def test_the_split_is_deterministic_and_holds_out_the_last_prompts_of_each_suite():
    workload = load_workload(list(BUILTIN_SUITES), Path("."))
    first, again = split(workload), split(load_workload(list(BUILTIN_SUITES), Path(".")))
    assert first == again
    splits, unsplit = first
    assert set(splits) == set(BUILTIN_SUITES) and unsplit == {}
    for suite, s in splits.items():
        ids = [p.id for p in workload.prompts if p.suite == suite]
        assert len(s.held_out) >= 2 and s.tuning and list(s.tuning + s.held_out) == ids
    assert splits["code"].held_out == ("code-parse-args", "code-unittest")


def test_a_suite_of_two_prompts_has_no_split_and_says_why():
    workload = Workload(tuple(Prompt(f"{s}-{i}", s, "x") for s, n in (("a", 2), ("b", 6)) for i in range(n)))
    splits, unsplit = split(workload)
    assert list(splits) == ["b"] and splits["b"].held_out == ("b-4", "b-5")
    assert "2 prompt(s)" in unsplit["a"]


def test_a_tuning_rate_pools_the_tuning_prompts_samples_only():
    samples = tuple(
        {"prompt_id": p, "suite": "s", "repetition": r, "predicted_n": 10, "predicted_ms": ms}
        for r in (0, 1)
        for p, ms in (("t", 100.0), ("h", 1000.0))
    )
    record = TrialRecord(0, "COMPLETE", "search", TrialConfig(), samples=samples)
    assert tuning_rate(record, ["t"]) == pytest.approx(100.0)
    assert tuning_rate(record, ["t", "h"]) == pytest.approx(20 / 1.1)
    assert tuning_rate(record, ["other"]) is None


# ------------------------------------------------------------------ the classifier


def test_content_type_names_the_built_in_suites_prompts():
    correct, total, misses = accuracy()
    assert total == 34 and correct >= 32, misses
    assert content_type('{"name": "Ada", "age":') == "json"
    assert content_type("def f(x):\n    return x\n") == "code"
    assert content_type("def f(x):\n    return x\n\nRename x to value.\n\ndef f(value):\n") == "code-edit"
    passage = "The module reads files.\n" * 6
    assert content_type(passage + "\nQuestion: What does it read?\nAnswer:") == "docqa"
    assert content_type(passage + "\nSummary of the passage above:") == "summarize"
    assert content_type("Once upon a time there was") == "prose"
    assert content_type("Q: What is 3 + 4?\nA:") == "math"


def test_a_tool_s_output_handed_back_is_agent_traffic_in_text_or_in_the_openai_tool_shape():
    tool_output = "Tool read_file('a.py') returned:\n\ndef f(x):\n    return x\n\nTask: rename x."
    assert content_type(tool_output) == "agent"
    assert content_type("Thought: look it up\nAction: search[gc]\nObservation: gc frees cycles.") == "agent"
    assert content_type("def f(x):\n    return x\n") == "code"  # code alone stays code
    calls = [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]
    chat = [
        {"role": "user", "content": "Once upon a time there was"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "def f(x): ..."},
    ]
    assert request_type({"messages": chat}) == "agent"
    assert request_type({"messages": chat[:1]}) == "prose"


# ------------------------------------------------------------------ merging the preset


OTHERS = (
    "version = 1\n; hand-kept comment\n\n[*]\nc = 8192\n\n[other-study]\n; tuner export: study other\n"
    "model = /m/o.gguf\nspec-draft-n-max = 8\n\n\n[hand-written]  ; mine\nmodel = /m/x.gguf ; keep\n\n"
)


def test_merging_sections_keeps_other_studies_sections_byte_for_byte_and_never_duplicates(tmp_path):
    path = tmp_path / "models-preset.ini"
    path.write_text(OTHERS)
    sections = {
        "demo": ["[demo]", "model = /m/t.gguf"],
        "demo-code": ["[demo-code]", "model = /m/t.gguf", "spec-draft-n-max = 16"],
    }
    merge_sections(path, sections)
    merge_sections(path, {**sections, "demo": ["[demo]", "model = /m/t2.gguf"]})  # again: replaced, not added
    text = path.read_text()
    assert text.startswith(OTHERS)
    assert text.count("[demo]") == 1 and text.count("[demo-code]") == 1 and "/m/t2.gguf" in text
    # a hand-duplicated section of ours is collapsed to one, in its first place
    path.write_text(OTHERS + "[demo]\nmodel = a\n\n[demo]\nmodel = b\n")
    merge_sections(path, {"demo": ["[demo]", "model = c"]})
    assert path.read_text() == OTHERS + "[demo]\nmodel = c\n\n"


# ------------------------------------------------------------------ on the stand-in server


def two_type_study(tmp_path: Path, **fields) -> Path:
    """Code and prose suites of three prompts; the stand-in drafts prose badly past K=2."""
    path = write_study(tmp_path, f"sqlite:///{tmp_path / 's.db'}", name="mixed", **fields)
    data = yaml.safe_load(path.read_text())
    (tmp_path / "code.yaml").write_text(
        yaml.safe_dump({"prompts": [{"id": f"c{i}", "text": f"def f{i}(a, b):\n"} for i in range(3)]})
    )
    (tmp_path / "prose.yaml").write_text(
        yaml.safe_dump(
            {"prompts": [{"id": f"p{i}", "text": f"PROSE: the story number {i} begins"} for i in range(3)]}
        )
    )
    data.update(
        workload={"suites": ["code.yaml", "prose.yaml"], "n_predict": 8},
        budget={"trials": 3},
        race={"min_rounds": 3, "max_rounds": 3, "confirm_rounds": 3, "max_finalists": 2},
        warm_start=[{"spec_type": "draft-simple", "draft": "draft", "draft_max": k} for k in (2, 4)],
    )
    data.update(fields)
    path.write_text(yaml.safe_dump(data))
    return path


def test_per_type_export_races_on_held_out_prompts_and_writes_the_sections_that_pay(
    tmp_path, env, monkeypatch, capsys
):
    monkeypatch.setenv("FAKE_LLAMA_SHORT_K", "PROSE")
    path = two_type_study(tmp_path)
    run_study(load_spec(path), progress=Progress.quiet())
    out, preset = tmp_path / "export", tmp_path / "models-preset.ini"
    stale = "[mixed-prose]\n; an earlier export's\nmodel = /m/old.gguf\n\n"
    preset.write_text(OTHERS + stale)
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert main(["export", "mixed", "--storage", url, "--out", str(out), "--preset", str(preset)]) == 0
    printed = capsys.readouterr().out
    assert "per-type winners" in printed and "tuner.decisions.route.content_type: " in printed
    study, _ = store.open_stored_study("mixed", url)
    result = PerTypeResult.from_json(store.read_per_type(study))
    by_type = {t.suite: t for t in result.types}
    code, prose = by_type["code"], by_type["prose"]
    assert code.held_out_prompts == ["c1", "c2"] and code.tuning_prompts == ["c0"]  # max(2, 3 // 3) held out
    # the pooled winner is the short K (prose pulls it down); code's own winner drafts longer and pays
    assert prose.config["draft_max"] == 2 and not prose.pays and prose.winner == result.pooled
    assert code.config["draft_max"] == 4 and code.pays and code.gain_low > 1.0
    assert code.held_out_tokens_per_second > code.pooled_held_out_tokens_per_second
    text = preset.read_text()
    assert text.startswith(OTHERS + stale) and "[mixed]" in text and "[mixed-code]" in text
    assert text.count("[mixed-prose]") == 1  # an earlier export's section is kept, and the export says so
    assert (
        "prose: no own entry" in printed
        and "note: section [mixed-prose] of an earlier export is kept" in printed
    )
    router = (out / "serve-router.sh").read_text()
    assert "--models-preset" in router and str(preset.resolve()) in router
    assert "mixed-code" in (out / "ROUTER.md").read_text() and '"model"' in (out / "ROUTER.md").read_text()
    assert json.loads((out / "config.json").read_text())["per_type"]["types"]
    # the report's per-type section: the K curves and the table with the held-out figures
    page = render(report_data(study, store.read_study_record(study), Bandwidth(1e10, "test", "test")))
    section = page.split('<section id="per-type">')[1].split("</section>")[0]
    assert 'id="fig-per-type"' in section and "own entry" in section and "t/s held-out" in section
    assert f"{code.held_out_tokens_per_second:.2f}" in section


def test_per_type_export_of_a_one_type_study_is_a_clear_message_not_an_empty_file(tmp_path, env, capsys):
    path = write_study(tmp_path, f"sqlite:///{tmp_path / 's.db'}", budget={"trials": 2})
    run_study(load_spec(path), progress=Progress.quiet())
    out, preset = tmp_path / "export", tmp_path / "models-preset.ini"
    assert (
        main(
            [
                "export",
                "t",
                "--storage",
                f"sqlite:///{tmp_path / 's.db'}",
                "--per-type",
                "--no-race",
                "--out",
                str(out),
                "--preset",
                str(preset),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        "--per-type: study 't' measured one content type (suite)" in err
        and "export without --per-type" in err
    )
    assert not preset.exists() and not out.exists()


# ------------------------------------------------------------------ the real router


def served_export(study: str, trial: int, k: int, section: str = "") -> Export:
    """An export of target + draft-small at draft length K, as `tuner export` builds it from a trial."""
    synth = models_dir() / "synthetic"
    command = ServerCommand(
        (),
        str(binary("llama-server")),
        (
            ("--model", str(synth / "target.gguf")),
            ("--threads", "1"),
            ("--ctx-size", "512"),
            ("--parallel", "1"),
            ("--no-webui", None),
            ("-md", str(synth / "draft-small.gguf")),
            ("--spec-type", "draft-simple"),
            ("--spec-draft-n-max", str(k)),
            ("-td", "1"),
        ),
    )
    config = {"spec_type": "draft-simple", "draft": "draft-small", "draft_max": k, "temperature": 0.0}
    per_type = {
        "types": [
            {
                "suite": "code",
                "held_out_tokens_per_second": 1.0,
                "gain": 1.1,
                "gain_low": 1.05,
                "gain_high": 1.2,
            }
        ]
    }
    return Export(
        study=study,
        trial=trial,
        policy="test",
        config=config,
        metrics={"tokens_per_second": 1.0, "speedup": 1.0, "acceptance": 0.5, "quality": 1.0},
        argv=command.argv,
        command=command,
        per_content_type=[],
        llama_cpp={},
        machine={},
        per_type=per_type,
        section_name=section,
    )


def post_json(url: str, body: dict, timeout: float = 180.0) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.load(resp)


@pytest.mark.llama
@pytest.mark.slow
def test_the_exported_router_serves_every_section_with_its_own_speculative_settings(
    synthetic_models, tmp_path
):
    out, preset = tmp_path / "export", tmp_path / "models-preset.ini"
    preset.write_text(OTHERS.replace("[other-study]", "[other-study]\nload-on-startup = false"))
    pooled, code = served_export("synth", 3, 2), served_export("synth", 5, 12, "synth-code")
    write_export(pooled, out, preset, [code])
    assert preset.read_text().startswith(OTHERS.split("[other-study]")[0])
    port = free_port()
    log = tmp_path / "router.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [str(out / "serve-router.sh")],
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "LLAMA_ARG_PORT": str(port)},
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_json(proc, f"{base}/health", 90, "the router")
        listed = {m["id"] for m in get_json(f"{base}/models")["data"]}
        assert {"synth", "synth-code", "other-study", "hand-written"} <= listed
        lengths: dict[str, float] = {}
        for name, k in (("synth", 2), ("synth-code", 12)):
            answer = post_json(
                f"{base}/v1/completions",
                {"model": name, "prompt": "def add(a, b):\n    return", "max_tokens": 16, "temperature": 0},
            )
            assert answer["usage"]["completion_tokens"] > 0
            props = get_json(f"{base}/props?model={name}")
            assert props["model_alias"] == name  # answered by that section's own server
            # (the pinned build's /props shows speculative.types "none" even while drafting: not evidence)
            entry = next(m for m in get_json(f"{base}/models")["data"] if m["id"] == name)
            args = entry["status"]["args"]
            child = int(args[args.index("--port") + 1])
            # the child's own log, forwarded by the router as "[PORT] ...": how long its drafts were
            lines = wait_for(
                lambda: [
                    line
                    for line in log.read_text(errors="replace").splitlines()
                    if line.startswith(f"[{child:5d}]") and "draft acceptance" in line
                ],
                30,
                f"{name}'s draft statistics in the log",
            )
            mean_len = float(re.search(r"mean len =\s*([\d.]+)", lines[-1]).group(1))
            lengths[name] = mean_len
            assert 0 < mean_len <= k, lines
        assert lengths["synth"] <= 2 < lengths["synth-code"], lengths  # K=2 against K=12, each its own
    finally:
        stop_group(proc)
    # every child the router started has stopped too (conftest's check sees this session's llama-* processes)
    wait_for(lambda: not running_llama_processes(), 30, "the router's child servers to stop")
