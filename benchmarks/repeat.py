"""Repeatability: two studies of one study file with different seeds, each run to its race's deployment, and
what they deployed re-measured side by side.

Why: the product deploys what a study's finalist race picks, and every deployment states what it may lose
("no other finalist is more than 6.1% faster, 95%"). Another run of the same study should deploy something
within that bound. Both seeds' studies run as ``make demo`` runs them (search, then the race), then both
deployments, and beside them each search's best recorded trial (the search-only figure, no race), are launched
in rounds of fresh launches in a balanced order (``tuner.decisions.remeasure``), so the comparison is of
configurations, not of two moments of a noisy machine. Target: each deployment's stated bound holds against the
other run's deployment.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import optuna

from tuner import figure_text
from tuner.decisions import evidence
from tuner.decisions.race import RaceResult
from tuner.decisions.remeasure import Contender, rounds_of_launches
from tuner.errors import UserError
from tuner.prepare import prepare
from tuner.progress import Progress
from tuner.run.study_loop import run_study
from tuner.storage import store
from tuner.storage.records import TrialRecord
from tuner.studyfile.spec import RaceSpec, StudySpec, load_spec

SEARCH_TOLERANCE = 0.05  # the search-only figure: the slower best recorded trial within 5% of the faster


@dataclass(frozen=True)
class Pick:
    """One configuration a run chose, and its rates when re-measured side by side."""

    trial: int
    config: dict
    recorded_tokens_per_second: float
    argv: list[str]  # without --host/--port
    remeasured_tokens_per_second: list[float]  # one pooled rate per round


@dataclass(frozen=True)
class Run:
    """One seed's study: what its search recorded best, what its race deployed and what it said it may lose."""

    study: str
    seed: int
    searched: Pick  # the best recorded trial (one launch; no race)
    deployed: Pick  # the race's deployment (the baseline when nothing was shown faster)
    decided: bool
    loss_bound: float | None  # no other finalist more than this much faster (95%); None: no bound
    loss_text: str


@dataclass(frozen=True)
class RepeatResult:
    study_file: str
    trials_per_study: int
    rounds: int
    runs: list[Run]
    deployed_ratio: (
        float  # the second run's deployment over the first's: geometric mean of paired round ratios
    )
    deployed_low: float  # its 95% t-interval
    deployed_high: float
    search_ratio: float  # median re-measured tokens/s of the slower best recorded trial / the faster one

    def holds(self, run_index: int) -> bool | None:
        """Run ``run_index``'s bound holds against the other run's deployment: the other re-measured at most
        ``loss_bound`` faster (None where run ``run_index`` stated no bound)."""
        bound = self.runs[run_index].loss_bound
        if bound is None:
            return None
        other_over_own = self.deployed_ratio if run_index == 0 else 1 / self.deployed_ratio
        return other_over_own <= 1 + bound

    @property
    def met(self) -> bool:
        """Every stated bound holds (a run without one has nothing to hold)."""
        return all(self.holds(i) is not False for i in range(len(self.runs)))

    @property
    def search_met(self) -> bool:
        return self.search_ratio >= 1.0 - SEARCH_TOLERANCE

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "holds": [self.holds(i) for i in range(len(self.runs))],
            "met": self.met,
            "search_met": self.search_met,
        }


def measure_repeatability(
    study_file: str | Path | StudySpec,
    storage_db: Path,
    *,
    seeds: tuple[int, int] = (1, 2),
    trials: int | None = None,
    rounds: int = 3,
    race: RaceSpec | None = None,
    progress: Progress,
) -> RepeatResult:
    """Run the two studies to their races' deployments in a fresh SQLite file, then re-measure both deployments
    and both searches' best recorded trials side by side. ``race`` replaces the study's race settings."""
    spec = study_file if isinstance(study_file, StudySpec) else load_spec(study_file)
    storage_db.parent.mkdir(parents=True, exist_ok=True)
    storage_db.unlink(missing_ok=True)  # every figure from this session
    budget = trials or spec.budget_trials
    runs = []
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
            race=race or spec.race,
        )
        runs.append(_run_to_deployment(seeded, seed, budget, progress))
    picks = [p for r in runs for p in (r.deployed, r.searched)]
    rates = side_by_side(spec, picks, rounds, progress)
    runs = [
        replace(
            r,
            deployed=replace(r.deployed, remeasured_tokens_per_second=rates[2 * i]),
            searched=replace(r.searched, remeasured_tokens_per_second=rates[2 * i + 1]),
        )
        for i, r in enumerate(runs)
    ]
    deployed = evidence.ratio(rates[2], rates[0])
    searched = [statistics.median(rates[1]), statistics.median(rates[3])]
    return RepeatResult(
        study_file=str(spec.path),
        trials_per_study=budget,
        rounds=rounds,
        runs=runs,
        deployed_ratio=deployed.estimate,
        deployed_low=deployed.low,
        deployed_high=deployed.high,
        search_ratio=min(searched) / max(searched),
    )


def _pick(record: TrialRecord) -> Pick:
    assert record.metrics is not None, "a deployed or best recorded trial is complete, so it has metrics"
    return Pick(record.number, record.config.as_dict(), record.metrics.tokens_per_second, record.argv, [])


def _run_to_deployment(spec: StudySpec, seed: int, budget: int, progress: Progress) -> Run:
    """One seed's study, searched and raced as ``make demo`` does; what it deployed and said it may lose."""
    study = run_study(spec, progress=Progress(progress.out), race=True)  # the run's lines timed on its own
    best = store.best_feasible(study)
    if best is None:
        raise UserError(f"study {spec.name}: no feasible trial in {budget} trials; raise --repeat-trials")
    race = _stored_race(study)
    if race is None:  # nothing to race: the best recorded trial is the baseline itself
        return Run(
            spec.name, seed, _pick(best), _pick(best), False, None, "nothing to race besides the baseline"
        )
    deployed = next(r for r in store.read_trials(study) if r.number == race.winner)
    return Run(spec.name, seed, _pick(best), _pick(deployed), race.decided, race.loss_bound, race.loss_line())


def _stored_race(study: optuna.Study) -> RaceResult | None:
    stored = store.read_race(study)
    return RaceResult.from_json(stored) if stored else None


def side_by_side(spec: StudySpec, picks: list[Pick], rounds: int, progress: Progress) -> list[list[float]]:
    """The picks re-measured over rounds of fresh launches (``tuner.decisions.remeasure``), one contender per
    distinct command (a configuration two runs both chose is launched once a round); rates in the picks' order."""
    ctx = prepare(spec)
    labels: dict[tuple[str, ...], str] = {}
    for pick in picks:
        labels.setdefault(tuple(pick.argv), "ABCD"[len(labels)])
    contenders = [
        Contender(labels[tuple(p.argv)], p.argv, p.config.get("temperature", 0.0))
        for p in {tuple(p.argv): p for p in picks}.values()
    ]
    rates = rounds_of_launches(contenders, ctx.workload, ctx.settings, rounds, ctx.log_dir, progress)
    return [rates[labels[tuple(p.argv)]].tokens_per_second for p in picks]


def markdown(result: RepeatResult) -> str:
    lines = [
        "| study | seed | | trial | configuration | recorded t/s | re-measured t/s (median) | what it may lose |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in result.runs:
        for what, pick in (("deployed", run.deployed), ("searched best", run.searched)):
            knobs = " ".join(f"{k}={v}" for k, v in pick.config.items())
            lines.append(
                f"| {run.study} | {run.seed} | {what} | {pick.trial} | {knobs} | "
                f"{pick.recorded_tokens_per_second:.1f} | {statistics.median(pick.remeasured_tokens_per_second):.1f} "
                f"| {run.loss_text if what == 'deployed' else 'no race'} |"
            )
    ratio = evidence.Ratio(result.deployed_ratio, result.deployed_low, result.deployed_high, result.rounds)
    lines += [
        "",
        f"{result.trials_per_study} trials per study, each run to its race's deployment; "
        f"seed {result.runs[1].seed}'s deployment over seed {result.runs[0].seed}'s: {ratio.text()} over "
        f"{result.rounds} rounds of fresh launches (geometric mean of paired round ratios, 95% t-interval).",
    ]
    for index, run in enumerate(result.runs):
        other = result.runs[1 - index]
        holds = result.holds(index)
        over = result.deployed_ratio if index == 0 else 1 / result.deployed_ratio
        lines.append(
            f"- seed {run.seed}'s bound: "
            + (
                f"none stated ({run.loss_text})"
                if holds is None
                else f"the other deployment may be at most {figure_text.percent_up(run.loss_bound)} faster; re-measured "
                f"seed {other.seed}'s at x{over:.3f} of it (the bound allows x{1 + (run.loss_bound or 0):.3f}): "
                + ("holds" if holds else "DOES NOT HOLD")
            )
        )
    lines += [
        f"Deployments: {'every stated bound holds' if result.met else 'a stated bound MISSED'}.",
        f"Search only (each run's best recorded trial, one launch each, no race): slower / faster re-measured "
        f"{result.search_ratio:.3f} (target >= {1 - SEARCH_TOLERANCE:.2f}): "
        f"{'met' if result.search_met else 'missed'}.",
        "",
    ]
    return "\n".join(lines)
