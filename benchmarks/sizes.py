"""How much each section of a bench session measures: the options as given, or ``--quick``'s smallest inputs,
and a study file as ``--quick`` shrinks it.

``--quick`` runs every section on its smallest input (one prompt of the studies' first suite, 8
tokens, the grid's first two launches, one seed, one round, one operator landscape, one drawn landscape): its figures mean nothing, it
shows in a few minutes that each section of ``make bench`` starts and finishes (tests/test_studies.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from benchmarks.landscape_draws import HELD_OUT_SEEDS
from benchmarks.operator_landscapes import LANDSCAPES
from tuner.errors import UserError
from tuner.measurement.workload import load_workload
from tuner.output.files import write_atomic
from tuner.studyfile.spec import StudySpec, load_spec


@dataclass(frozen=True)
class Sizes:
    """How much each section measures: the options as given, or ``--quick``'s smallest inputs."""

    seeds: int
    rounds: int
    decision_runs: int
    repeat_trials: int | None
    quick: bool = False
    grid_launches: int | None = None  # None: the whole grid
    operator: dict[str, Any] = field(default_factory=lambda: {"jobs": -1})
    # the held-out draws: all 100 (landscape_draws.HELD_OUT_SEEDS), 5 replays each
    held_out: dict[str, Any] = field(
        default_factory=lambda: {"draws": HELD_OUT_SEEDS, "seeds": 5, "jobs": -1}
    )
    overhead: dict[str, Any] = field(default_factory=dict)
    concurrency: dict[str, Any] = field(default_factory=dict)
    gguf: dict[str, Any] = field(default_factory=dict)


QUICK_N_PREDICT = 8


def sizes_of(seeds: int, rounds: int, decision_runs: int, repeat_trials: int | None, quick: bool) -> Sizes:
    """The section sizes; a count below 1 is one line naming its option."""
    counts = {
        "seeds": seeds,
        "rounds": rounds,
        "repeat_trials": repeat_trials,
        "decision_runs": decision_runs,
    }
    for name, count in counts.items():
        if count is not None and count < 1:
            raise UserError(f"--{name.replace('_', '-')}: must be >= 1, got {count}")
    if not quick:
        return Sizes(seeds, rounds, decision_runs, repeat_trials)
    return Sizes(
        seeds=1,
        rounds=1,
        decision_runs=2,
        repeat_trials=2,
        quick=True,
        grid_launches=2,
        operator={"names": LANDSCAPES[:1], "seeds": 1, "budget": 5, "baseline_budget": 5, "jobs": 1},
        held_out={"draws": HELD_OUT_SEEDS[:1], "seeds": 1, "budget": 5, "jobs": 1},
        overhead={"n_predict": QUICK_N_PREDICT, "repetitions": 1},
        concurrency={"tg": QUICK_N_PREDICT, "per_client": 1},
        gguf={"repeats": 1, "reference_repeats": 1},
    )


def study_spec(path: Path, sizes: Sizes, out: Path) -> StudySpec:
    """The study as written, shrunk for ``--quick`` (``shrunk``)."""
    return shrunk(load_spec(path), sizes, out)


def shrunk(spec: StudySpec, sizes: Sizes, out: Path) -> StudySpec:
    """The study as given; for ``--quick``, one prompt of its first suite, 8 tokens, two passes, no
    warm-up."""
    if not sizes.quick:
        return spec
    settings = replace(
        spec.measurement, warmup=0, repetitions=2, max_repetitions=None, n_predict=QUICK_N_PREDICT
    )
    return replace(spec, suites=(quick_suite(spec, out),), measurement=settings, budget_minutes=None)


def quick_suite(spec: StudySpec, out: Path) -> str:
    """The first prompt of the study's first suite as a suite file of its own under ``out``; a
    conversation or a prompt with expected answers keeps its whole suite (it needs the suite's context)."""
    first = load_workload(list(spec.suites[:1]), spec.base_dir).prompts[0]
    if first.chat or first.expected:
        return spec.suites[0]
    path = write_atomic(
        out / f"quick-{spec.suites[0].replace('/', '-').removesuffix('.yaml')}.yaml",
        yaml.safe_dump({"prompts": [{"id": first.id, "text": first.text}]}, sort_keys=False),
    )
    return str(path.absolute())
