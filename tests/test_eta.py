"""Time (issue 32): `tuner run --check`'s table and estimate, and elapsed / remaining time on every progress
line of `tuner run`, `tuner export`, the race and the llama.cpp build, also in the study's dashboard attr.

Runs on the stand-in llama-server; expected figures come from the study's own estimate and records.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace

import pytest
from fake_llama_server import write_study

from tuner import eta
from tuner.cli import main
from tuner.errors import UserError
from tuner.machine.llama_build import build_eta, run_logged
from tuner.paths import REPO_ROOT
from tuner.prepare import prepare, study_estimate
from tuner.progress import Progress
from tuner.run.study_loop import run_study
from tuner.storage import store
from tuner.studyfile.spec import load_spec

SUFFIX = re.compile(
    r" \| (\d+h\d\dm|\d+m\d\ds|\d+s) elapsed, ~(\d+h\d\dm|\d+m\d\ds|\d+s) left"
    r"(?: \((?:\d+h\d\dm|\d+m\d\ds|\d+s) over the estimate\))?$"
)


def seconds(text: str) -> int:
    """A duration as ``eta.duration`` writes it, back in seconds."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    h, m, s = (int(p or 0) for p in parts.groups())
    return 3600 * h + 60 * m + s


# ------------------------------------------------------------------ the estimate


def test_the_estimate_counts_tokens_levels_sentinels_and_the_race_at_its_most():
    m = eta.machine(weights_bytes=6e9, files_bytes=6e9, bandwidth=20e9)
    assert m.decode_bound == "bandwidth" and m.token_s == pytest.approx(6e9 / (20e9 * eta.DECODE_EFFICIENCY))
    assert eta.machine(1e6, 1e6, 20e9).token_s == eta.TOKEN_FLOOR_S  # a tiny model: per-token overhead
    passes = eta.Passes([50] * 10, n_predict=64, warmup=1, repetitions=2, levels=())
    search = eta.SearchPlan(trials=20, sentinel_every=5, sentinel_minutes=None, budget_minutes=None)
    race = eta.RacePlan(rounds=8, finalists=4, confirm_rounds=4, min_rounds=3)
    one = eta.estimate(m, passes, search, race)
    # every finalist and the baseline for 3 rounds, then at most 4 (typically 2) a round, then the confirmation
    assert one.sentinels == 4 and one.race_launches == 3 * 5 + 5 * 4 + 2 * 4
    assert one.race_typical == 3 * 5 + 5 * 2 + 2 * 4
    assert one.trials_s == pytest.approx(24 * one.trial_s) and one.race_s == pytest.approx(43 * one.launch_s)
    assert (
        one.expected_s() == pytest.approx(one.trials_s + 33 * one.launch_s)
        and one.expected_s(False) == one.trials_s
    )
    # twice the tokens per request: the decode part of a trial doubles, the launch does not
    longer = eta.estimate(m, replace(passes, n_predict=128), search, race)
    decode = (2 * 10 + 1) * 64 * m.token_s  # 2 repetitions of 10 prompts, and the warm-up request
    assert longer.trial_s - one.trial_s == pytest.approx(decode)
    # a space that speculates: searched trials decode faster, the baseline and sentinels at the target's rate;
    # pruning takes its share of the searched trials' passes
    searched = eta.estimate(m, passes, replace(search, speculative=True, prune=True), race)
    assert (
        searched.reference_s == pytest.approx(one.trial_s)
        and searched.trial_s < one.trial_s / eta.SEARCH_SPEEDUP
    )
    assert searched.trials_s == pytest.approx(19 * searched.trial_s + 5 * searched.reference_s)
    assert searched.launch_s < one.launch_s
    # concurrency levels add their requests and export races each load class; a budget in minutes caps the
    # trials; few trials, few finalists
    two_levels = replace(passes, levels=(1, 2))
    loaded = eta.with_export(eta.estimate(m, two_levels, search, race), two_levels, race)
    assert loaded.trial_s > one.trial_s
    (classes,) = loaded.export
    assert classes.what == "load classes" and classes.launches == 2 * (3 * 5 + 5 * 4)
    assert classes.typical == 2 * (3 * 5 + 5 * 2) and loaded.export_typical_s < loaded.export_s
    # several content types with held-out prompts: export's per-type race
    typed = eta.with_export(one, passes, race, [50] * 4, 3)
    assert [p.what for p in typed.export] == ["per-type race"] and typed.export[0].launches == 4 * 5
    assert typed.export[0].launch_s < typed.launch_s  # 4 held-out requests, not the 10 of a pass
    capped = eta.estimate(m, passes, replace(search, budget_minutes=1), race)
    assert capped.trials_s == 60
    few = eta.estimate(m, passes, replace(search, trials=3), race)
    assert few.finalists == 2 and few.race_launches == 8 * 3 + 8
    # sentinels by time when that comes first
    often = eta.estimate(m, passes, replace(search, sentinel_minutes=one.trial_s * 20 / 60 / 10), race)
    assert often.sentinels == 10


def test_progress_lines_count_down_from_the_plan_and_feed_the_sink():
    now = [100.0]
    lines, figures = [], []
    p = Progress(lines.append, clock=lambda: now[0])
    p.sink = figures.append
    p("starting")
    assert lines[-1] == "starting | 0s elapsed"  # nothing planned yet: no time left said
    p.time.plan(100.0)
    now[0] += 30
    p("trial 1")
    assert lines[-1] == "trial 1 | 30s elapsed, ~1m10s left"
    assert figures[-1]["line"] == "trial 1" and figures[-1]["remaining_s"] == 70.0
    t = p.time
    t.unit_s, t.then_units, t.then_s = 2.0, 3, 10.0
    t.expect(5)  # (5 + 3) launches of 2 s, then 10 s
    assert t.remaining() == 26.0
    now[0] += 100
    assert t.remaining() == 0.0  # overdue: never negative, and by how much
    assert t.suffix() == "2m10s elapsed, ~0s left (1m14s over the estimate)" and SUFFIX.search(
        " | " + t.suffix()
    )
    untimed = Progress.untimed(lines.append)  # the benchmark's simulated race: lines as they are
    untimed.time.expect(3)  # no launch timed yet: nothing to plan
    untimed("race round 1: a")
    assert lines[-1] == "race round 1: a" and untimed.time.remaining() is None
    watch = eta.Stopwatch(t)
    assert watch.time(2, lambda: now.__setitem__(0, now[0] + 8) or "done") == "done" and t.unit_s == 4.0
    assert eta.duration(59.6) == "1m00s" and eta.duration(3725) == "1h02m"


def test_the_build_line_says_elapsed_and_what_is_left(tmp_path, capsys):
    assert build_eta(60, 25) == "1m00s elapsed, ~3m00s left" and build_eta(5, 0) == "5s elapsed"
    script = "; ".join(f"print('[ {p:2d}%] Building x')" for p in (5, 10, 50, 100))
    with open(tmp_path / "build.log", "w") as log:
        run_logged([sys.executable, "-c", script], log, progress=True)
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in printed] == ["llama.cpp: 5%", "llama.cpp: 50%", "llama.cpp: 100%"]
    assert all(re.search(r"\(\d+s elapsed, ~\d+s left\)$", line) for line in printed)


# ------------------------------------------------------------------ tuner run --check


@pytest.fixture
def levels_study(tmp_path, env):
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    return write_study(
        tmp_path,
        storage,
        workload={"suites": ["suite.yaml"], "n_predict": 8, "concurrency": [1, 2]},
        budget={"trials": 3},
        race={"min_rounds": 3, "max_rounds": 4, "confirm_rounds": 2},
    )


def test_check_prints_a_short_table_with_the_space_what_was_left_out_and_the_time(levels_study, capsys):
    assert main(["run", str(levels_study), "--check"]) == 0
    out = capsys.readouterr().out.splitlines()
    ctx = prepare(load_spec(levels_study))
    est = study_estimate(ctx)
    assert len(out) < 60 and not any(line.lstrip().startswith(("{", '"')) for line in out)
    table = out[out.index("knob            values") + 1 :]
    rows = {line.split()[0]: line.split(None, 1)[1] for line in table[: table.index("")]}
    assert rows["draft_max"] == "2, 3, 4, 5, 6, 8" and rows["spec_type"] == "none, draft-simple"
    assert set(rows) == set(ctx.space.domains)
    assert "prompts      2 (suite 2); n_predict 8, warm-up 0, 1 repetition(s)" in out
    assert "users        1, 2 at once, each level in every trial" in out
    total = next(line for line in out if line.startswith("  total"))
    assert seconds(total.split("~")[1].split()[0]) == round(est.expected_s())
    assert seconds(total.split("at most ~")[1].rstrip(")")) == round(est.trials_s + est.race_s + est.export_s)
    race = next(line for line in out if line.startswith("  race"))
    assert "at most 4 rounds of 3 launches, at most 4 after round 3 + 2 confirmation rounds x 2" in race
    assert race.endswith("(under 5 rounds no race decides: each ends with what it may lose)")
    assert any(line.startswith("  export   load classes: 2 classes") for line in out)
    assert sum(line.lstrip().startswith("basis:") for line in out) == 1
    # --json keeps the old output for scripts; --json alone is a one-line error
    assert main(["run", str(levels_study), "--check", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["space"]["draft_max"][1]["values"] == [2, 3, 4, 5, 6, 8]
    assert main(["run", str(levels_study), "--json"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_check_says_what_the_machine_and_model_left_out(tmp_path, env, capsys):
    path = write_study(
        tmp_path,
        f"sqlite:///{tmp_path / 'studies.db'}",
        search_space={
            "file": str(REPO_ROOT / "search_spaces" / "default.yaml"),
            "overrides": {"threads": 1, "spec_type": ["none"]},
        },
    )
    assert main(["run", str(path), "--check"]) == 0
    out = capsys.readouterr().out
    for note in prepare(load_spec(path)).space.notes:
        assert f"  {note}\n" in out
    assert "  cache_reuse 0, mmap on, mlock off: llama.cpp's defaults, not searched" in out


@pytest.mark.parametrize("study", sorted((REPO_ROOT / "studies").glob("*.yaml")), ids=lambda p: p.stem)
def test_check_of_every_shipped_study_is_under_sixty_lines_with_an_estimate(study, synthetic_models, capsys):
    try:
        spec = load_spec(study)
    except UserError as err:  # ${MODELS} unset, a model absent: the Qwen studies need their GGUFs
        pytest.skip(str(err))
    missing = [p for p in (spec.target, *spec.drafts) if not p.is_file()]
    if missing:
        pytest.skip(f"{missing[0]} is not on this machine")
    assert main(["run", str(study), "--check"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) < 60 and any(re.match(r"  total    ~\S+", line) for line in out), out


# ------------------------------------------------------------------ progress of run, race and export


def test_every_progress_line_of_run_race_and_export_says_elapsed_and_left(levels_study, capsys):
    spec = load_spec(levels_study)
    lines: list[str] = []
    study = run_study(spec, progress=Progress(lines.append), race=True)
    table = next(
        i for i, line in enumerate(lines) if re.match(r"race: \d+ (selection )?rounds, \d+ launches", line)
    )
    progress, result = lines[:table], lines[table:]
    assert any(line.startswith("[3/3] trial") for line in progress)
    assert any(line.startswith("race round 1:") for line in progress)
    assert all(SUFFIX.search(line) for line in progress), [l for l in progress if not SUFFIX.search(l)]
    assert not any(SUFFIX.search(line) for line in result)  # the result table is not progress
    # the first plan is the study's estimate; the race's rounds count down to its end
    first = next(line for line in progress if line.startswith("study t:"))
    est = study_estimate(prepare(spec))
    assert abs(seconds(SUFFIX.search(first).group(2)) - (est.trials_s + est.race_typical_s)) <= 2
    rounds = [seconds(SUFFIX.search(line).group(2)) for line in progress if line.startswith("race round")]
    assert rounds == sorted(rounds, reverse=True)
    stored = store.read_progress(study)
    assert stored["command"] == "tuner run" and stored["line"].startswith("finished: 3 of 3 trials")
    assert stored["remaining_s"] == 0 and stored["elapsed_s"] > 0

    out = levels_study.parent / "export"
    preset = levels_study.parent / "preset.ini"
    argv = ["export", "t", "--storage", spec.storage, "--out", str(out), "--preset", str(preset)]
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    race_lines = [line for line in printed if line.startswith(("race round", "race: confirming"))]
    assert race_lines and all(SUFFIX.search(line) for line in race_lines)
    exported = store.read_progress(study)
    assert exported["command"] == "tuner export" and exported["remaining_s"] == 0


def test_a_run_without_race_plans_no_race_time(levels_study):
    spec = replace(load_spec(levels_study), budget_trials=1)
    lines: list[str] = []
    run_study(spec, progress=Progress(lines.append), race=False)
    last = next(line for line in lines if line.startswith("[1/1] trial"))
    assert SUFFIX.search(last).group(2) == "0s"
