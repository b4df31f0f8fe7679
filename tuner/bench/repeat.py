"""Repeatability: two studies of one study file with different seeds, winners re-measured side by side.

Why: a study's winner is only worth exporting if another run of the same study would
have found something as fast. Two studies that differ only in the sampler seed each
pick their best feasible trial; both winners are then measured in rounds of fresh launches
(A then B, then B then A), so the comparison is of configurations,
not of two moments of a noisy machine. Target: tokens/s within 5% of each other.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from tuner.context import prepare
from tuner.decisions.remeasure import Contender, rounds_of_launches
from tuner.errors import UserError
from tuner.storage.store import best_feasible
from tuner.study import run_study
from tuner.studyfile.spec import StudySpec, load_spec

TOLERANCE = 0.05


@dataclass(frozen=True)
class Winner:
    study: str
    seed: int
    trial: int
    config: dict
    recorded_tokens_per_second: float
    argv: list[str]  # without --host/--port
    remeasured_tokens_per_second: list[float]  # one pooled rate per round


@dataclass(frozen=True)
class RepeatResult:
    study_file: str
    trials_per_study: int
    rounds: int
    winners: list[Winner]
    same_config: bool
    ratio: float  # median re-measured tokens/s of the slower winner / the faster one

    @property
    def met(self) -> bool:
        return self.ratio >= 1.0 - TOLERANCE

    def to_dict(self) -> dict:
        return {**asdict(self), "met": self.met}


def measure_repeatability(
    study_file: str | Path | StudySpec,
    storage_db: Path,
    *,
    seeds: tuple[int, int] = (1, 2),
    trials: int | None = None,
    rounds: int = 3,
    progress: Callable[[str], None] = print,
) -> RepeatResult:
    """Run the two studies in a fresh SQLite file, then re-measure their winners side by side."""
    spec = study_file if isinstance(study_file, StudySpec) else load_spec(study_file)
    storage_db.parent.mkdir(parents=True, exist_ok=True)
    storage_db.unlink(missing_ok=True)  # every figure from this session
    budget = trials or spec.budget_trials
    winners = []
    for seed in seeds:
        # reuse off: the second seed must not warm-start from the first one's winner (independent runs)
        seeded = replace(
            spec,
            name=f"{spec.name}-repeat-seed{seed}",
            seed=seed,
            budget_trials=budget,
            budget_minutes=None,
            storage=f"sqlite:///{storage_db}",
            reuse=False,
        )
        study = run_study(seeded, progress=progress)
        best = best_feasible(study)
        if best is None:
            raise UserError(
                f"study {seeded.name}: no feasible trial in {budget} trials; raise --repeat-trials"
            )
        winners.append(
            Winner(
                seeded.name,
                seed,
                best.number,
                best.config.as_dict(),
                best.metrics.tokens_per_second,
                best.argv,
                [],
            )
        )
    rates = side_by_side(spec, winners, rounds, progress)
    winners = [replace(w, remeasured_tokens_per_second=r) for w, r in zip(winners, rates)]
    medians = [statistics.median(r) for r in rates]
    return RepeatResult(
        str(spec.path),
        budget,
        rounds,
        winners,
        same_config=winners[0].config == winners[1].config,
        ratio=min(medians) / max(medians),
    )


def side_by_side(
    spec: StudySpec, winners: list[Winner], rounds: int, progress: Callable[[str], None]
) -> list[list[float]]:
    """Both winners re-measured over rounds of fresh launches (``tuner.decisions.remeasure``)."""
    ctx = prepare(spec)
    contenders = [
        Contender(label, w.argv, w.config.get("temperature", 0.0)) for label, w in zip("AB", winners)
    ]
    rates = rounds_of_launches(contenders, ctx.workload, ctx.settings, rounds, ctx.log_dir, progress)
    return [rates[c.label].tokens_per_second for c in contenders]


def markdown(result: RepeatResult) -> str:
    lines = ["| study | seed | winner | recorded t/s | re-measured t/s (median) |", "|---|---|---|---|---|"]
    for w in result.winners:
        knobs = " ".join(f"{k}={v}" for k, v in w.config.items())
        lines.append(
            f"| {w.study} | {w.seed} | trial {w.trial}: {knobs} | {w.recorded_tokens_per_second:.1f} | "
            f"{statistics.median(w.remeasured_tokens_per_second):.1f} |"
        )
    lines += [
        "",
        f"{result.trials_per_study} trials per study; winners {'identical' if result.same_config else 'differ'}; "
        f"slower / faster re-measured: {result.ratio:.3f} over {result.rounds} rounds of fresh launches "
        f"(target >= {1 - TOLERANCE:.2f}): {'met' if result.met else 'MISSED'}.",
        "",
    ]
    return "\n".join(lines)
