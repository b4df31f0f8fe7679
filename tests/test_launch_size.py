"""How much a race launch measures (tuner.decisions.launch_size): units on crafted spreads, costs and trials."""

from __future__ import annotations

import math

import pytest

from tuner.decisions.drift import allowed_launch_spread, estimated_launch_spread
from tuner.decisions.launch_size import MAX_PASSES, from_trials, optimum_share, relative_cost, size
from tuner.knobs.config import TrialConfig
from tuner.measurement.workload import Prompt, Workload
from tuner.progress import Progress
from tuner.storage.records import Metrics, Spread, TrialRecord

SUITES = {"code": 6, "prose": 6}


def test_the_optimum_is_cochrans_two_stage_share_and_costs_least():
    share = optimum_share(0.10, 0.02, 30.0, 60.0)
    assert share == pytest.approx(math.sqrt(0.5) * 0.2)
    for other in (share / 2, share * 2, 1.0):
        assert relative_cost(share, 0.10, 0.02, 30.0, 60.0) < relative_cost(other, 0.10, 0.02, 30.0, 60.0)


def test_a_dominant_launch_spread_buys_a_stratified_part_of_a_pass():
    chosen = size(0.10, 0.02, 30.0, 60.0, SUITES)
    assert chosen.per_suite == {"code": 1, "prose": 1} and chosen.passes == 1
    assert chosen.share == pytest.approx(2 / 12)
    assert chosen.saving > 0.3
    assert chosen.rounds(10) > 10  # the same time buys more rounds of shorter launches
    assert "entries of a pass" in chosen.text() and "less time to the same precision" in chosen.text()


def test_a_noisy_pass_and_a_dear_launch_buy_several_passes():
    chosen = size(0.02, 0.10, 600.0, 60.0, SUITES)
    assert chosen.passes == MAX_PASSES and not chosen.per_suite
    assert chosen.rounds(10) < 10


def test_one_pass_unless_another_size_saves_enough():
    chosen = size(0.05, 0.05, 45.0, 45.0, SUITES)
    assert (chosen.share, chosen.passes, chosen.per_suite) == (1.0, 1, {})
    assert chosen.rounds(8) == 8 and "one pass" in chosen.text()


def test_each_round_measures_the_next_part_of_every_suite_the_same_for_every_finalist():
    prompts = tuple(Prompt(f"{s}-{i}", s, f"text {s} {i}") for s in ("code", "prose") for i in range(6))
    workload = Workload(prompts)
    chosen = size(0.10, 0.05, 30.0, 60.0, SUITES)
    k = chosen.per_suite["code"]
    parts = [chosen.workload(workload, r) for r in range(6)]
    assert all(sum(p.suite == "code" for p in part.prompts) == k for part in parts)
    assert parts[0] == chosen.workload(workload, 0)  # every finalist of a round gets the same part
    seen = {p.id for part in parts for p in part.prompts}
    assert seen == {p.id for p in prompts}  # the parts rotate through every entry


def test_the_point_estimate_of_the_launch_spread_sits_below_the_bound_decisions_allow():
    steps = [0.04, -0.05]
    assert estimated_launch_spread(steps) < allowed_launch_spread(steps)
    assert estimated_launch_spread([]) == pytest.approx(0.05)  # the prior alone


def _trial(number: int, cv: float | None, repetitions: int, duration: float, wall_ms: float) -> TrialRecord:
    samples = tuple(
        {"prompt_id": f"p{i}", "suite": "code", "repetition": r, "wall_ms": wall_ms}
        for r in range(repetitions)
        for i in range(4)
    )
    return TrialRecord(
        number,
        "COMPLETE",
        "search",
        TrialConfig(),
        metrics=Metrics(100.0, 0.0, 1.0, 1.0),
        spread=Spread(repetitions, cv, None),
        samples=samples,
        duration_s=duration,
    )


def test_sizes_from_a_studys_trials_pool_their_pass_spread_and_times():
    workload = Workload(tuple(Prompt(f"p{i}", "code", "x") for i in range(4)))
    assert from_trials([_trial(0, None, 1, 10.0, 500.0)], 0.05, workload) is None  # one pass: spread unknown
    chosen = from_trials([_trial(0, 0.03, 2, 14.0, 1000.0), _trial(1, 0.04, 2, 14.0, 1000.0)], 0.05, workload)
    assert chosen is not None
    assert chosen.pass_s == pytest.approx(4.0)  # 4 requests of 1 s per pass
    assert chosen.fixed_s == pytest.approx(6.0)  # 14 s less two passes
    assert chosen.pass_sigma == pytest.approx(math.sqrt((0.03**2 + 0.04**2) / 2))


def test_a_race_launch_measures_its_rounds_part_and_passes(tmp_path):
    from tuner.decisions.remeasure import Remeasure
    from tuner.measurement.measure import MeasurementSettings

    prompts = tuple(Prompt(f"{s}-{i}", s, f"text {s} {i}") for s in ("code", "prose") for i in range(6))
    workload = Workload(prompts)
    part = size(0.10, 0.02, 30.0, 60.0, SUITES)
    remeasure = Remeasure(workload, MeasurementSettings(repetitions=3), tmp_path, Progress.quiet(), size=part)
    assert remeasure.settings.repetitions == 1
    remeasure.round_index = 1
    assert remeasure.measured == part.workload(workload, 1) != part.workload(workload, 0)
    several = Remeasure(
        workload,
        MeasurementSettings(),
        tmp_path,
        Progress.quiet(),
        size=size(0.02, 0.10, 600.0, 60.0, SUITES),
    )
    assert several.settings.repetitions == MAX_PASSES and several.measured == workload
    assert (
        Remeasure(
            workload, MeasurementSettings(repetitions=3), tmp_path, Progress.quiet()
        ).settings.repetitions
        == 1
    )


def test_no_size_leaves_a_race_fewer_rounds_than_a_decision_needs():
    """The demo's export once sized launches to 3 passes, 'at most 3 rounds in that time': too short to decide."""
    free = size(0.02, 0.10, 30.0, 30.0, SUITES)
    assert free.passes == MAX_PASSES and free.rounds(11) < 5  # the optimum alone would leave 4 rounds
    chosen = size(0.02, 0.10, 30.0, 30.0, SUITES, max_rounds=11)
    assert chosen.passes == 3 and chosen.rounds(11) >= 5
    assert (
        "4 passes, the optimum, would leave 4 rounds" in chosen.text()
        and "the 5 a decision needs" in chosen.text()
    )
    short = size(0.02, 0.10, 30.0, 30.0, SUITES, max_rounds=4)  # a study's own race below 5 rounds
    assert short.passes == 1 and short.rounds(4) == 4 and "the 4 a decision needs" in short.text()
