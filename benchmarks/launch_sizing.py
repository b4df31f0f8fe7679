"""1d. How much a race launch measures: one full pass against the size the race chooses, at equal error.

Why: a launch's rate carries the launch's own effect and its pass's noise, and a launch costs a fixed part (load,
warm-up) and its passes (``tuner.decisions.launch_size``). Where the launch spread dominates, shorter passes and
more launches decide sooner; where a pass is noisy and a launch dear, several passes per launch. This section runs
the product's race (``tuner.decisions.race.sequential_race``, through ``race_bench.new_race``) on the simulated
host of the decision benchmark (``race_bench``) at the 3% gap, once with a full pass per launch and once with the size ``launch_size.size`` picks from
what a study would have measured: the launch spread's point estimate from three sentinels (``measured_launch_sigma``) and a pass's
spread from 8 trials of 2 passes each. A part ``m`` of a pass has ``1 / sqrt(m)`` times a pass's spread. A launch
costs ``FIXED_MIN + m x PASS_MIN`` minutes (``race_bench.MINUTES_PER_LAUNCH`` at one pass: a 32B-scale host).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import asdict, dataclass, replace

from benchmarks.race_bench import (
    LAUNCH_SPREADS,
    ROUND_SPREADS,
    Side,
    field_of,
    measured_launch_sigma,
    new_race,
    side,
)
from benchmarks.table import markdown_table
from tuner.decisions.drift import estimated_launch_spread
from tuner.decisions.launch_size import size
from tuner.studyfile.spec import RaceSpec

GAP = 0.03
FIXED_MIN = 0.5  # a launch's start, load and warm-up
PASS_MIN = 1.0  # one pass of the workload
SUITES = {"code": 6, "prose": 6}  # 12 entries, as the pruning benchmark's workload (``race_bench.PROMPTS``)
TRIALS, PASSES = 8, 2  # what a study measured a pass's spread on


def estimated_pass_sigma(pass_sigma: float, rng: random.Random) -> float:
    """A pass's spread as a study measures it: the RMS cv of ``TRIALS`` trials' ``PASSES`` passes each."""
    cvs = []
    for _ in range(TRIALS):
        rates = [math.exp(rng.gauss(0, pass_sigma)) for _ in range(PASSES)]
        cvs.append(statistics.stdev(rates) / statistics.fmean(rates))
    return math.sqrt(statistics.fmean(c * c for c in cvs))


@dataclass(frozen=True)
class SizingCell:
    launch_sigma: float
    round_sigma: float
    runs: int
    full: Side
    sized: Side
    full_minutes: float  # mean per race
    sized_minutes: float
    median_share: float  # passes per launch the race chose (a part below 1)


def sizing_cell(launch_sigma: float, round_sigma: float, runs: int, seed: int, spec: RaceSpec) -> SizingCell:
    rng = random.Random(seed)
    mus, resources = field_of(GAP)
    full = [new_race(mus, resources, launch_sigma, round_sigma, rng, spec) for _ in range(runs)]
    sized, minutes, shares = [], [], []
    for _ in range(runs):
        chosen = size(
            measured_launch_sigma(launch_sigma, rng, rule=estimated_launch_spread),
            estimated_pass_sigma(round_sigma, rng),
            FIXED_MIN,
            PASS_MIN,
            SUITES,
            spec.max_rounds,
        )
        budget = replace(spec, max_rounds=chosen.rounds(spec.max_rounds))
        race = new_race(mus, resources, launch_sigma, round_sigma / math.sqrt(chosen.share), rng, budget)
        sized.append(race)
        minutes.append(race.launches * (FIXED_MIN + chosen.share * PASS_MIN))
        shares.append(chosen.share)
    return SizingCell(
        launch_sigma,
        round_sigma,
        runs,
        side(full, mus),
        side(sized, mus),
        statistics.fmean(r.launches for r in full) * (FIXED_MIN + PASS_MIN),
        statistics.fmean(minutes),
        statistics.median(shares),
    )


def measure_sizing(runs: int = 400, seed: int = 500, spec: RaceSpec = RaceSpec()) -> dict:
    cells = [
        sizing_cell(ls, rs, runs, seed + i, spec)
        for i, (ls, rs) in enumerate((ls, rs) for ls in LAUNCH_SPREADS for rs in ROUND_SPREADS)
    ]
    return {"runs": runs, "gap": GAP, "cells": [asdict(c) for c in cells]}


def markdown(result: dict) -> str:
    lines = [
        f"The product's race at a {result['gap']:.0%} gap, {result['runs']} races per cell per size: one full pass "
        f"per launch against the size the race chooses from three sentinels and {TRIALS} trials of {PASSES} passes. "
        f"A launch costs {FIXED_MIN:g} min + {PASS_MIN:g} min per pass. Passes per launch: the median chosen (a "
        "part of a pass below 1).",
        "",
        *markdown_table(
            (
                "launch spread",
                "round spread",
                "passes per launch",
                "launches, full / sized",
                "modelled min, full / sized",
                "deployed >= 3% slower, full / sized",
                "loss bound holds, sized",
            ),
            (
                (
                    f"{c['launch_sigma']:.0%}",
                    f"{c['round_sigma']:.0%}",
                    f"{c['median_share']:.2f}",
                    f"{c['full']['launches']:.1f} / {c['sized']['launches']:.1f}",
                    f"{c['full_minutes']:.0f} / {c['sized_minutes']:.0f}",
                    f"{c['full']['wrong']:.1%} / {c['sized']['wrong']:.1%}",
                    f"{c['sized']['holds']:.1%}",
                )
                for c in result["cells"]
            ),
        ),
    ]
    return "\n".join(lines) + "\n"
