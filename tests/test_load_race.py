"""Load classes raced: a level's finalists, its race stored and read back per level, the break-even from the
races, and one race of launches serving 2 users at once (the stand-in, then the real synthetic family)."""

from __future__ import annotations

import re
from dataclasses import replace

import optuna
import pandas as pd
import pytest
import yaml
from fake_llama_server import write_study

from tuner.decisions.load_race import break_even, level_gain, race_levels, read_races
from tuner.decisions.race import Entry, RaceResult, RaceSetup, finalists, run_race, verdict_lines
from tuner.decisions.remeasure import contender
from tuner.knobs.config import TrialConfig
from tuner.machine.topology import read_topology
from tuner.measurement.launch import build_server_command
from tuner.paths import models_dir
from tuner.prepare import prepare
from tuner.progress import Progress
from tuner.run.study_loop import run_study
from tuner.storage import store
from tuner.storage.records import Metrics, Spread, TrialRecord
from tuner.studyfile.spec import RaceSpec, load_spec


def record(number: int, tps: float, c2: float, *, role: str = "search", k: int | None = None) -> TrialRecord:
    config = TrialConfig(spec_type="draft-simple" if k else "none", draft="d" if k else None, draft_max=k)
    return TrialRecord(
        number=number,
        state="COMPLETE",
        role=role,
        config=config,
        worker="h:1",
        metrics=Metrics(tps, 0.5, 1.0, 1.0),
        spread=Spread(3, 0.01, False),
        constraint=-0.01,
        started_at=number,
        ended_at=number + 1,
        load=(
            {"users": 1, "aggregate_tokens_per_second": tps},
            {"users": 2, "aggregate_tokens_per_second": c2},
        ),
    )


def test_a_load_class_has_its_own_finalists_on_the_levels_aggregate_tokens_per_second():
    records = [
        record(0, 100.0, 180.0, role="baseline"),
        record(1, 200.0, 120.0, k=8),  # one user's best, far behind at 2 users
        record(2, 150.0, 176.0, k=2),  # within reach of the baseline at 2 users
        record(3, 90.0, 100.0, k=4),
    ]
    assert [r.number for r in finalists(records, 0.02, 5)] == [1]
    assert [r.number for r in finalists(records, 0.02, 5, users=2)] == [0, 2]
    assert finalists(records, 0.02, 5, users=4) == []  # no trial measured 4 users


def entry(
    trial: int, k: int | None, speedup: float, low: float, high: float, status: str = "undecided"
) -> Entry:
    config = {"spec_type": "draft-simple", "draft": "d", "draft_max": k} if k else {"spec_type": "none"}
    rates = [100.0 * speedup] * 3
    return Entry(
        trial=trial,
        label=f"trial-{trial}",
        config=config,
        recorded_tokens_per_second=rates[0],
        rates=rates,
        mean_tokens_per_second=rates[0],
        speedup=speedup,
        speedup_low=low,
        speedup_high=high,
        status=status,
        accepted=[],
        rounds=[1, 2, 3],
    )


def race(users: int, spec: tuple[float, float, float], winner_speculates: bool = True) -> RaceResult:
    base = entry(0, None, 1.0, 1.0, 1.0, "winner" if not winner_speculates else "undecided")
    fast = entry(1, 4, *spec, status="winner" if winner_speculates else "undecided")
    return RaceResult(
        rounds=3,
        baseline_trial=0,
        entries=[fast, base],
        winner=1 if winner_speculates else 0,
        decided=True,
        verdict="v",
        rule="rule",
        loss=0.02,
        drafted={},
        outliers=[],
        launches=6,
        confirmation=None,
        loss_bound=0.01,
        leader=1,
        forecast="",
        users=users,
    )


def test_load_class_races_are_stored_per_level_read_back_and_cleared():
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), study_name="s")
    store.write_load_race(study, 4, race(4, (0.9, 0.8, 0.95)).to_json())
    store.write_load_race(study, 2, race(2, (1.3, 1.2, 1.4)).to_json())
    store.write_race(study, race(1, (1.5, 1.4, 1.6)).to_json())  # the pooled race is not a load class
    races = read_races(study)
    assert list(races) == [2, 4] and races[2].users == 2 and races[2].title == "race c2"
    assert RaceResult.from_json(store.read_race(study)).users == 1
    store.write_load_race(study, 4, None)  # an export that found nothing to race at 4 users
    assert list(read_races(study)) == [2]
    lines = verdict_lines(races[2])
    assert lines[0].startswith(
        "race c2: 3 rounds, 6 launches (per finalist: geometric mean aggregate tokens/s at 2"
    )
    assert any(line.startswith("c2 verdict: v") for line in lines)
    assert any(line.startswith("c2 loss: deployed trial 1") for line in lines)


def test_the_break_even_from_races_names_the_first_level_not_shown_to_pay_with_its_interval():
    pays = {1: race(1, (1.5, 1.4, 1.6)), 2: race(2, (1.2, 1.1, 1.3))}
    assert break_even(pays).startswith(
        "speculation pays at every raced level (1 user: x1.50 [1.40, 1.60] (d, trial 1, over trial 0); 2 users"
    )
    stops = {**pays, 4: race(4, (0.8, 0.7, 0.9), winner_speculates=False)}
    assert break_even(stops).startswith("speculation stops paying at 4 users at once on this host")
    close = {**pays, 4: race(4, (1.02, 0.95, 1.1))}
    assert break_even(close).startswith(
        "speculation is shown to pay up to 2 users; at 4 users at once the race"
    )
    only_plain = race(4, (1.0, 1.0, 1.0), winner_speculates=False)
    only_plain = replace(only_plain, entries=[e for e in only_plain.entries if e.trial == 0])
    gain = level_gain(only_plain)
    assert gain.speculative is None and gain.loses and "no speculative finalist" in gain.text()


def test_a_load_class_contender_serves_its_users_on_as_many_slots(tmp_path):
    command = build_server_command(TrialConfig(threads=1), _launch_context(tmp_path))
    r = replace(record(3, 100.0, 150.0), command=command)
    assert contender("trial-3", r).argv == command.argv and contender("trial-3", r).users is None
    two = contender("trial-3", r, users=2)
    assert two.users == 2 and two.argv[two.argv.index("--parallel") + 1] == "2"
    assert two.argv.count("--parallel") == 1


def _launch_context(tmp_path):
    from tuner.measurement.launch import LaunchContext

    return LaunchContext(
        tmp_path / "llama-server", tmp_path / "t.gguf", {}, None, read_topology(), None, 512, slots=4
    )


def test_a_load_class_race_on_the_stand_in_launches_each_contender_with_its_users(tmp_path, env):
    path = write_study(
        tmp_path,
        f"sqlite:///{tmp_path / 's.db'}",
        workload={"suites": ["suite.yaml"], "n_predict": 8, "concurrency": [1, 2]},
        budget={"trials": 3},
        race={"min_rounds": 3, "max_rounds": 3},
    )
    spec = load_spec(path)
    study = run_study(spec, progress=Progress.quiet(), race=False)
    lines: list[str] = []
    races = race_levels(prepare(spec), study, (2,), Progress(lines.append))
    stored = read_races(study)
    assert races[2] is not None  # the stand-in's draft trials are within reach of the baseline at 2 users
    assert stored[2] == races[2] and races[2].users == 2
    assert any(line.startswith("race c2: ") for line in lines)
    assert any(re.match(r"race c2 round 3: ", line) for line in lines)
    launched = [
        line for line in (tmp_path / "launches.jsonl").read_text().splitlines() if '"--parallel", "2"' in line
    ]
    assert len(launched) >= 2 * 3  # every contender with 2 slots, each round
    entry = races[2].winning
    assert entry.recorded_tokens_per_second == store.read_trial(study.trials[entry.trial]).level_figure(
        "aggregate_tokens_per_second", 2
    )


@pytest.mark.llama
@pytest.mark.slow
def test_a_real_load_class_race_at_two_users_on_the_synthetic_family(synthetic_models, tmp_path):
    """The synthetic target alone against it with n-gram lookup, 2 users at once on 2 slots, 3 rounds."""
    threads = min(2, read_topology().physical_cores)
    (tmp_path / "prompts.yaml").write_text(
        yaml.safe_dump(
            {
                "prompts": [
                    {"id": "code-1", "text": "def add(a, b):\n    return"},
                    {"id": "code-2", "text": "for i in range(10):\n"},
                ]
            }
        )
    )
    (tmp_path / "load.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "loadrace",
                "target": str(models_dir() / "synthetic" / "target.gguf"),
                "drafts": [],
                "search_space": {"overrides": {"spec_type": ["none", "ngram-mod"], "threads": threads}},
                "storage": f"sqlite:///{tmp_path / 's.db'}",
                "workload": {"suites": ["prompts.yaml"], "n_predict": 16, "concurrency": [1, 2]},
                "measurement": {"warmup": 1, "repetitions": 1, "ctx_size": 1024, "trial_timeout_s": 120},
            }
        )
    )
    ctx = prepare(load_spec(tmp_path / "load.yaml"))
    base, lookup = (
        TrialConfig(threads=threads),
        TrialConfig(spec_type="ngram-mod", draft_max=4, ngram_key=3, threads=threads),
    )
    baseline = TrialRecord(0, "COMPLETE", "baseline", base, build_server_command(base, ctx.launch))
    candidate = TrialRecord(1, "COMPLETE", "search", lookup, build_server_command(lookup, ctx.launch))
    lines: list[str] = []
    setup = RaceSetup(ctx.workload, ctx.settings, RaceSpec(min_rounds=3, max_rounds=3), ctx.log_dir, users=2)
    result = run_race(ctx.study_record("h:1"), [candidate], baseline, setup, Progress(lines.append))
    for line in [*lines, *verdict_lines(result)]:
        print(line)
    # what the race decided from what it measured, whatever the host's other work made of the rates: a round
    # line per round it ran, each entry launched in the rounds it is stored with, one short only when dropped
    assert result.users == 2 and 1 <= result.rounds <= 3
    assert [line.split(":")[0] for line in lines if line.startswith("race c2 round")] == [
        f"race c2 round {r}" for r in range(1, result.rounds + 1)
    ]
    for entry in result.entries:
        assert len(entry.rates) == len(entry.rounds) and min(entry.rates) > 0
        # a round short only where the entry was dropped, or its launch was left out as an outlier (and said so)
        left_out = [r for r in range(1, result.rounds + 1) if r not in entry.rounds]
        named = [line for line in result.outliers if f"{entry.label} measured" in line]
        assert len(left_out) <= len(named) or entry.status.startswith("dropped: "), (entry, result.outliers)
    assert result.winner in {e.trial for e in result.entries}
    assert any(line.startswith("c2 verdict: ") for line in verdict_lines(result))
    assert (ctx.log_dir / "remeasure-trial-1-c2-1.log").exists() or any(
        ctx.log_dir.glob("remeasure-trial-*-c2-*.log")
    )


def test_the_reports_break_even_uses_the_load_class_races_when_they_exist():
    from tuner.output.analysis import break_even as report_break_even

    curves = pd.DataFrame(
        [("none", 2, 100.0, 0), ("draft", 2, 150.0, 1)],
        columns=["family", "users", "aggregate_tokens_per_second", "trial"],
    )
    races = {2: race(2, (1.02, 0.95, 1.1))}
    assert report_break_even(curves, races=races) == break_even(races)
    assert report_break_even(curves).startswith("speculation pays at every measured level (2 users: x1.50")
