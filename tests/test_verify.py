"""`tuner verify`: the verdict rule, the deployed section read as the router reads it, and a real check.

The rule and the parsing are checked on their own; then, on the pinned llama-server and the synthetic MoE
target (one active expert is much faster than the default four), a study is exported with its race and its
section verified as exported, edited to a slower setting, and on another build.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import optuna
import pytest
import yaml
from fake_llama_server import run_study_file

from benchmarks.replay import replay_record
from tuner.cli import main
from tuner.decisions import evidence
from tuner.decisions.race import Confirmation, Entry, RaceResult
from tuner.decisions.verify_rule import (
    HOLDS,
    NOT_FASTER,
    SMALLER,
    Claim,
    build_change,
    claim_for,
    edits,
    rounds_to_show,
    section_contender,
    verdict,
    verification_workload,
    why_lines,
)
from tuner.errors import UserError
from tuner.machine.llama_build import binary
from tuner.measurement.workload import Prompt, Workload
from tuner.output.analysis import report_data
from tuner.output.preset import DeployedSection, read_section
from tuner.output.report_html import render
from tuner.output.report_tables import verification_table
from tuner.output.verify_run import read_deployed
from tuner.storage import store

# ------------------------------------------------------------------ the rule


@pytest.mark.parametrize(
    ("low", "high", "rounds", "expected"),
    [
        (1.2, 1.9, 3, HOLDS),  # the claim (x1.50 [1.30, 1.70]) inside
        (1.1, 1.35, 3, HOLDS),  # below the claimed estimate, but reaching its interval
        (1.8, 1.9, 3, HOLDS),  # wholly above the claim: faster than claimed
        (1.1, 1.3, 3, HOLDS),  # an interval ending where the claim's begins is not below it
        (1.1, 1.2, 3, HOLDS),  # below the claim's interval, within CLAIM_TOLERANCE of it (1.3 x 0.9 = 1.17)
        (
            1.05,
            1.15,
            3,
            SMALLER,
        ),  # shown faster, wholly below the claim's interval by more than the tolerance
        (0.9, 1.8, 3, NOT_FASTER),  # reaches 1
        (1.0, 1.3, 3, NOT_FASTER),  # touching 1 is not above it
        (1.2, 1.9, 2, NOT_FASTER),  # too few rounds for an interval
    ],
)
def test_the_verdict_rule(low, high, rounds, expected):
    assert verdict(evidence.Ratio(1.2, low, high, rounds), Claim(1.5, 1.3, 1.7, "race")) == expected


def test_a_claim_without_an_interval_is_compared_at_its_estimate():
    assert (
        verdict(evidence.Ratio(1.2, 1.1, 1.3, 3), Claim(1.5, 0.0, math.inf, "race")) == SMALLER
    )  # 1.5 x 0.9
    assert verdict(evidence.Ratio(1.2, 1.1, 1.6, 3), Claim(1.5, 0.0, math.inf, "race")) == HOLDS


def raced(confirmed: bool = False) -> RaceResult:
    """The baseline (trial 0) and trial 2, which won at x1.50 [1.20, 1.87]; trial 3 rested."""

    def entry(trial: int, speedup: float, low: float, high: float, status: str) -> Entry:
        return Entry(
            trial=trial,
            label=f"trial-{trial}",
            config={},
            recorded_tokens_per_second=10.0,
            rates=[10.0] * 4,
            mean_tokens_per_second=10.0,
            speedup=speedup,
            speedup_low=low,
            speedup_high=high,
            status=status,
            accepted=[],
            rounds=[1, 2, 3, 4],
        )

    entries = [
        entry(2, 1.5, 1.2, 1.87, "winner"),
        entry(3, 1.1, 0.8, 1.4, "undecided"),
        entry(0, 1, 1, 1, ""),
    ]
    confirmation = (
        Confirmation(
            rounds=3, winner_rates=[15.0] * 3, baseline_rates=[10.0] * 3, speedup=1.45, low=1.3, high=1.6
        )
        if confirmed
        else None
    )
    return RaceResult(
        rounds=4,
        baseline_trial=0,
        entries=entries,
        winner=2,
        decided=True,
        verdict="won",
        rule="",
        loss=0.02,
        drafted={},
        outliers=[],
        launches=12,
        confirmation=confirmation,
    )


def test_the_claim_is_the_exports_figure_for_the_sections_trial():
    claim = claim_for(raced(), 2)
    assert (claim.speedup, claim.low, claim.high) == (1.5, 1.2, 1.87)
    assert claim.source == "the export's race, 4 paired rounds"
    confirmed = claim_for(raced(confirmed=True), 2)
    assert (confirmed.speedup, confirmed.source) == (1.45, "the export's 3 confirmation rounds")
    assert claim_for(raced(), 3).speedup == 1.1  # a finalist the race measured, not the one it deployed
    with pytest.raises(UserError, match=r"^trial 0 is the study's baseline: the export deployed llama.cpp's"):
        claim_for(raced(), 0)
    with pytest.raises(UserError, match=r"^trial 7 is not in the study's last race \(trials 2, 3, 0\)"):
        claim_for(raced(), 7)


def test_a_forecast_says_what_would_show_a_close_section_faster():
    mine, theirs = [11.0, 10.2, 10.9, 9.9], [10.0] * 4  # about 5% faster, not shown at 4 rounds
    assert verdict(evidence.ratio(mine, theirs), Claim(1.05, 1.0, 1.1, "race")) == NOT_FASTER
    assert 4 < rounds_to_show(mine, theirs) < 40
    assert rounds_to_show([9.0] * 3, [10.0] * 3) == math.inf  # slower: no number of rounds shows it faster


def test_what_changed_is_named_and_a_lone_build_change_takes_the_blame():
    study = {"commit": "0c1e570", "build_number": 1, "cmake_flags": ["-O3"], "bin_dir": "/pinned"}
    assert build_change(study, {**study, "bin_dir": "/copy"}) == ""  # the same build, elsewhere
    build = build_change(study, {**study, "commit": "deadbee", "build_number": 2, "bin_dir": "/new"})
    assert build == (
        "the study measured llama.cpp 0c1e570 (build 1, /pinned); this run uses llama.cpp deadbee (build 2, /new) "
        "(commit 0c1e570 -> deadbee; build_number 1 -> 2)"
    )
    # the flags each llama-server lists, where both manifests hold them: a build that speculates by default says so
    flags = {**study, "server_flags": ["--spec-type", "--threads"]}
    newer = {**flags, "server_flags": ["--no-spec-type", "--spec-type", "--threads"]}
    assert build_change(flags, newer).endswith("(its llama-server adds --no-spec-type)")
    assert build_change(flags, {**study, "server_flags": ["--threads"]}).endswith(
        "(its llama-server drops --spec-type)"
    )
    assert build_change(study, newer) == ""  # a study stored before the flags were: only what both hold
    assert why_lines(NOT_FASTER, build, [], []) == [
        f"the build changed: {build}; the only change since the export, so the difference is put down to it"
    ]
    assert why_lines(HOLDS, build, [], []) == [f"the build changed: {build}; the claim still holds"]
    both = why_lines(SMALLER, build, ["threads = 1 (exported 2)"], [])
    assert both[1] == "the section was edited: threads = 1 (exported 2)" and "cannot tell which" in both[-1]
    assert "the host's state now" in why_lines(NOT_FASTER, "", [], [])[0]


# ------------------------------------------------------------------ the deployed section


def test_the_section_is_read_as_the_router_serves_it(tmp_path):
    preset = tmp_path / "models-preset.ini"
    preset.write_text(
        "version = 1\n\n[*]\nc = 1024\nthreads = 4\n\n"
        "[s]\n; tuner export: study s, trial 2 (max-tps)\n"
        "; tuned under numactl --interleave=all: start the router with it to keep that memory policy\n"
        "model = /m.gguf\nthreads = 2  ; the operator's note\nno-webui = true\n\n[other]\nmodel = /o.gguf\n"
    )
    section = read_section(preset, "s")
    assert section.options == {"model": "/m.gguf", "threads": "2", "no-webui": "true"}
    assert section.served == {"c": "1024", "threads": "2", "model": "/m.gguf", "no-webui": "true"}
    assert (section.origin, section.numactl) == (("s", 2), ("--interleave=all",))
    with pytest.raises(
        UserError, match=r"models-preset.ini: no section \[t\] \(its sections: s, other\); pass"
    ):
        read_section(preset, "t")
    preset.write_text("[s]\nthreads\n")
    with pytest.raises(UserError, match=r"models-preset.ini: \[s\]: 'threads' is not `key = value`"):
        read_section(preset, "s")


def test_a_section_launches_with_its_options_on_the_build_in_use(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    options = {"model": str(model), "c": "1024", "no-webui": "true", "temp": "0.2"}
    c = section_contender(options, Path("/new/llama-server"), None, (), "p.ini: [s]")
    assert c.argv == ["/new/llama-server", "--model", str(model), "-c", "1024", "--no-webui", "--temp", "0.2"]
    assert (c.temperature, c.models, c.numa) == (0.2, (str(model),), "none")
    pinned = section_contender(options, Path("/s"), "/usr/bin/numactl", ("--interleave=all",), "p.ini: [s]")
    assert pinned.argv[:3] == ["/usr/bin/numactl", "--interleave=all", "/s"] and pinned.numa == "interleave"
    with pytest.raises(UserError, match=r"^p.ini: \[s\]: model = /gone.gguf: no such file on this host"):
        section_contender({"model": "/gone.gguf"}, Path("/s"), None, (), "p.ini: [s]")
    with pytest.raises(
        UserError, match=r"^p.ini: \[s\]: tuned under numactl --membind=1, which is not installed"
    ):
        section_contender({}, Path("/s"), None, ("--membind=1",), "p.ini: [s]")
    assert edits({"threads": "2", "temp": "0"}, {"threads": "1", "c": "64"}) == [
        "threads = 1 (exported 2)",
        "temp removed (exported 0)",
        "c = 64 added",
    ]


def test_the_held_out_prompts_are_measured_and_a_small_suite_whole():
    prompts = [Prompt(f"code-{i}", "code", f"def f{i}():") for i in range(4)]
    prompts += [Prompt("prose-1", "prose", "Once")]
    measured, note = verification_workload(Workload(tuple(prompts)))
    assert [p.id for p in measured.prompts] == ["code-2", "code-3", "prose-1"]
    assert note == "2 held-out prompts (code) and every prompt of prose (1: too few to hold some out)"
    whole, note = verification_workload(Workload(tuple(prompts[-1:])))
    assert whole.prompts == tuple(prompts[-1:]) and note.startswith("the whole workload (1 prompts; no suite")


def test_verifications_are_kept_in_order_and_shown_in_the_report():
    study = optuna.create_study()
    assert store.read_verifications(study) == []
    for verdict_ in (HOLDS, NOT_FASTER):
        line = {"time": "t", "section": "s", "trial": 2, "build": "deadbee", "study_build": "0c1e570"}
        store.append_verification(
            study, {**line, "speedup": 1.4, "low": 1.1, "high": None, "verdict": verdict_}
        )
    assert [v["verdict"] for v in store.read_verifications(study)] == [HOLDS, NOT_FASTER]
    table = verification_table(store.read_verifications(study))
    assert "deadbee (the study&#x27;s: 0c1e570)" in table and "x1.40 [1.10, no bound]" in table
    assert table.index(HOLDS) < table.index(NOT_FASTER)


def test_a_study_without_a_race_or_another_studys_section_is_a_one_line_error(tmp_path):
    study, record = optuna.create_study(), replay_record("s", {}, ())
    section = DeployedSection(tmp_path / "p.ini", "s", {}, {}, ("other", 2), ())
    with pytest.raises(
        UserError, match=r"^study 's' has no stored race, so its export claimed no raced speedup; "
    ):
        read_deployed(study, record, section)
    store.write_race(study, raced().to_json())
    with pytest.raises(
        UserError, match=r"p.ini: \[s\] was exported from study 'other', not 's'; verify that study"
    ):
        read_deployed(study, record, section)


def test_too_few_rounds_is_a_one_line_error(capsys):
    assert main(["verify", "any", "--rounds", "2"]) == 2
    assert capsys.readouterr().err == (
        "tuner verify: error: --rounds 2: a 95% interval needs at least 3 paired rounds\n"
    )


# ------------------------------------------------------------------ on the real llama-server


@pytest.fixture(scope="module")
def exported(synthetic_models, storage, tmp_path_factory):
    """(study, storage, preset file, trial): a study of the synthetic MoE target on one thread, its baseline (four
    active experts) and one active expert (about 1.5x faster, and a different text: the floor is 0), exported
    with a race of five rounds into a preset file of its own."""
    folder = tmp_path_factory.mktemp("verified")
    code = ["def add(a, b):\n", "for i in range(10):\n", "class Point:\n", "import os\n"]
    prompts = [{"id": f"code-{i}", "text": text} for i, text in enumerate(code)]
    (folder / "prompts.yaml").write_text(yaml.safe_dump({"prompts": prompts}))
    space = {"spec_type": "none", "experts": [1, 4], "temperature": 0.0, "threads": 1}
    study_file = {
        "name": "verified",
        "target": str(synthetic_models.path("moe-target")),
        "drafts": [],
        "search_space": {"overrides": space},
        "warm_start": [{"spec_type": "none", "experts": 1, "temperature": 0.0, "threads": 1}],
        "budget": {"trials": 2},
        "quality": {"scorer": "agreement", "floor": 0.0},
        "workload": {"suites": ["prompts.yaml"], "n_predict": 128},
        "measurement": {"warmup": 0, "repetitions": 1, "ctx_size": 1024, "trial_timeout_s": 120},
        "race": {"min_rounds": 5, "max_rounds": 5},
        "storage": storage,
    }
    (folder / "verified.yaml").write_text(yaml.safe_dump(study_file))
    study, _ = run_study_file(folder / "verified.yaml")
    trial = next(r.number for r in store.read_trials(study) if r.config.experts == 1)
    preset = folder / "models-preset.ini"
    argv = ["export", "verified", "--storage", storage, "--trial", str(trial), "--preset", str(preset)]
    assert main([*argv, "--out", str(folder / "export")]) == 0
    race = RaceResult.from_json(store.read_race(study))
    assert race.winner == trial, "the race did not show one active expert faster than four"
    return study, storage, preset, trial


def verify(exported, tmp_path, edit: tuple[str, str] | None = None, rounds: int = 3) -> list[str]:
    """`tuner verify` on a copy of the exported preset (``edit``: one text of its section replaced)."""
    _, storage, preset, _ = exported
    copy = tmp_path / "models-preset.ini"
    shutil.copy(preset, copy)
    if edit:
        assert edit[0] in copy.read_text()
        copy.write_text(copy.read_text().replace(*edit))
    return ["verify", "verified", "--storage", storage, "--preset", str(copy), "--rounds", str(rounds)]


@pytest.mark.llama
@pytest.mark.slow
def test_the_exported_section_holds(exported, tmp_path, capsys, monkeypatch):
    """The verdict printed and the exit code are what the rule decides from the rounds measured against the claim
    (whichever it is: on a busy 2-core host one slowed launch can take the interval below the claim's, an honest
    verdict of a noisy pass), never that the noisy measurement landed on one side."""
    from tuner.decisions.verify_rule import EXIT

    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path))  # the launches' logs
    code = main(verify(exported, tmp_path, rounds=5))
    printed = capsys.readouterr().out
    checked = store.read_verifications(exported[0])[-1]
    ratio = evidence.Ratio(checked["speedup"], checked["low"], checked["high"], checked["rounds"])
    claim = Claim(checked["claim"], checked["claim_low"], checked["claim_high"], checked["claim_source"])
    again = evidence.ratio(checked["section_rates"], checked["baseline_rates"])  # the interval of its rounds
    assert (ratio.estimate, ratio.low, ratio.high) == pytest.approx((again.estimate, again.low, again.high))
    assert checked["verdict"] == verdict(ratio, claim) and code == EXIT[checked["verdict"]], printed
    assert f"verdict: {checked['verdict']}" in printed
    assert f"trial {exported[3]} of study verified (as exported)" in printed
    assert "on 2 held-out prompts (prompts)" in printed and "re-measure round 5/5" in printed
    assert checked["rounds"] == 5 and "the export claimed x" in printed
    assert "(the export's race, 5 paired rounds)" in printed


@pytest.mark.llama
@pytest.mark.slow
def test_a_section_edited_to_all_experts_is_no_longer_shown_faster(exported, tmp_path, capsys, monkeypatch):
    """Eight active experts read twice the expert weights of the baseline's four: clearly slower."""
    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path))
    assert main(verify(exported, tmp_path, ("expert_used_count=int:1", "expert_used_count=int:8"))) == 1
    printed = capsys.readouterr().out
    assert "verdict: no longer shown faster" in printed
    assert "why: the section was edited: override-kv = " in printed
    assert "the only change since the export, so the difference is put down to it" in printed


@pytest.mark.llama
@pytest.mark.slow
def test_another_build_is_named_and_every_verification_is_recorded_and_reported(
    exported, tmp_path, capsys, monkeypatch
):
    """LLAMA_CPP_BIN at a build whose llama-server says it is commit deadbee (the pinned one, wrapped)."""
    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path))
    pinned = binary("llama-server").parent
    other = tmp_path / "other-build"
    other.mkdir()
    for tool in pinned.iterdir():
        (other / tool.name).symlink_to(tool)
    (other / "llama-server").unlink()
    (other / "llama-server").write_text(
        f'#!/bin/sh\nif [ "$1" = --version ]; then "{pinned}/llama-server" --version 2>&1 | '
        f'sed \'s/commit [0-9a-f]*/commit deadbee/\' >&2; exit 0; fi\nexec "{pinned}/llama-server" "$@"\n'
    )
    os.chmod(other / "llama-server", 0o755)
    monkeypatch.setenv("LLAMA_CPP_BIN", str(other))
    before = len(store.read_verifications(exported[0]))
    code = main(verify(exported, tmp_path))
    printed = capsys.readouterr().out
    assert "verify: another build: the study measured llama.cpp 0c1e570 (build" in printed
    assert "this run uses llama.cpp deadbee (build" in printed and str(other) in printed
    assert "why: the build changed: the study measured llama.cpp 0c1e570" in printed
    lines = store.read_verifications(exported[0])
    assert len(lines) == before + 1
    assert lines[-1]["build"] == "deadbee" and lines[-1]["study_build"] == "0c1e570"
    assert code == {HOLDS: 0, NOT_FASTER: 1, SMALLER: 4}[lines[-1]["verdict"]]
    page = render(report_data(exported[0], store.read_study_record(exported[0])))
    shown = page.split('<section id="verifications">', 1)[1].split("</section>", 1)[0]
    assert shown.count("<tr>") == len(lines) + 1 and "deadbee (the study&#x27;s: 0c1e570)" in shown
    for line in lines:
        assert len(line["section_rates"]) == len(line["baseline_rates"]) == line["rounds"] in (3, 5)
        assert line["section"] == "verified" and line["trial"] == exported[3] and line["host"]
