"""Search efficiency at operator scale: replay the ``operator_landscapes`` as studies would run them.

Why: the recorded synthetic grid is too small to tell a good search from a lucky one. Here
each strategy runs a real Optuna study against a modelled 96-core box: parameters are
asked by ``tuner.search.space.suggest`` (integer ranges for K and threads, categoricals for the
rest), the baseline is enqueued first as ``tuner.run.study_start.ensure_baseline`` does, the study
carries the ``space`` and ``objectives`` attrs a real study has, and each trial is
simulated request by request (``OperatorLandscape.measure``) with its cost in seconds.
With pruning on, every request is offered to ``tuner.search.pruning.should_prune``
against the incumbent's per-prompt rates (where the study maximises them: ``prunes_on``); a
pruned trial is recorded as PRUNED with what it measured. A serving landscape's trial stores its
level's aggregate tokens/s as a study's record does (``TrialRecord.load``): its first objective.

Scores per replay: regret after t trials (1 - best true tokens/s among completed feasible
trials / the landscape's optimum; noise steers the sampler, it does not move the target; a configuration's nth
reading is drawn from the seed, the configuration and n: ``Objective.reading_noise``),
trials and measured seconds until the regret is within the tolerance. Strategies:
``default`` (``tuner.search.sampling.sampler_for("structured")``), ``warm`` (the default in a storage
that holds an earlier study on the same host, ``WARM_FROM``: the warm start of
``tuner.search.prior``), ``today`` (the previous default, ``NoRepeatSampler(TPE)``), ``tpe``
(Optuna's TPE), ``random``.
"""

from __future__ import annotations

import json
import math
import warnings
import zlib
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, TypedDict

import numpy as np
import optuna
from joblib import Parallel, delayed

from benchmarks.landscape_simulation import REPETITIONS, OperatorLandscape
from benchmarks.operator_landscapes import LANDSCAPES, REAL_RANGE_LANDSCAPES, landscapes
from tuner.knobs.config import TrialConfig
from tuner.measurement.measure import median_over_repetitions, pooled_from_rates, repetition_cv
from tuner.search.prior import find_prior
from tuner.search.pruning import prunes_on, should_prune
from tuner.search.space import baseline_config, enqueue_params, suggest
from tuner.storage import store
from tuner.storage.records import Failure, Metrics, Spread, TrialRecord

STRATEGIES = ("default", "warm", "today", "tpe", "random")
# The earlier study a ``warm`` replay follows in the same storage, on the same host: the same target on another
# workload (its hardware carries over), the same target and workload again (a re-tune after an upgrade: its
# winner too), another model (its hardware). ``dense-moved`` is another host: nothing to reuse.
WARM_FROM = {
    "dense-code": "dense-prose",
    "dense-prose": "dense-prose",
    "moe-lookup": "dense-code",
    "dense-stack": "dense-code",
}
TOLERANCE = 0.03
CHECKPOINTS = (10, 20, 40)
# trials to the tolerance on a host's real thread range: median, every seed (docs/decisions.md, "The budget's end")
REAL_MEDIAN, REAL_WORST = 8, 20
FLAT_NEAR_ALL_CORES = ("threads-flat",)
MAX_BEYOND_LADDER = 3  # thread trials past the ladder where decode is flat near all cores


class Failed(Exception):
    """The simulated server drafted nothing: a failed trial, as in a study."""


def make_sampler(strategy: str, seed: int, budget: int) -> optuna.samplers.BaseSampler:
    from tuner.search.sampling import sampler_for

    if strategy in ("default", "warm"):
        return sampler_for("structured", seed, budget)
    if strategy == "today":
        return sampler_for("tpe", seed, budget)
    if strategy == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    return sampler_for(strategy, seed, budget)


@dataclass(frozen=True)
class TrialLog:
    config: dict
    state: str  # complete, pruned, failed
    true_rate: float  # 0 unless completed and feasible
    seconds: float
    stage: str
    reason: str


class ReplayScores(TypedDict):
    """One replay's figures (``scores``)."""

    curve: list[float]  # regret after each trial
    trials: int | None  # trials until the regret is within the tolerance; None: never
    seconds: float | None  # measured seconds until then
    pruned: int
    total_seconds: float
    beyond_ladder: int  # thread trials past the ladder (``beyond_ladder``)
    rechecks: int  # refinement's checks of the final configuration's thread neighbours


class StrategyFigures(TypedDict):
    """A strategy's replays over the seeds, in one mode (full or pruned)."""

    trials_to_target: list[int | None]  # per seed
    median_trials: float | None  # None when more than half missed
    reached: int
    reached_by_40: int
    worst_trials: int | None  # None when a seed missed
    regret_at: dict[int, float]  # checkpoint -> median regret after that many trials
    median_seconds: float | None
    pruned_trials: float  # mean per replay
    beyond_ladder_max: int
    rechecks_max: int


class LandscapeReplays(TypedDict):
    """One landscape: what it is, its optimum, and each strategy's figures by mode ("full", "pruned")."""

    configurations: int
    optimum: float
    best_config: dict[str, Any]
    best_family: str
    description: str
    strategies: dict[str, dict[str, StrategyFigures]]


class LandscapeTargets(TypedDict, total=False):
    """The default against its targets on one landscape (``targets``): a real-range landscape's keys (with
    ``real_range``) or another's."""

    met: bool
    # another landscape's
    median_le_20: bool
    all_by_40: bool
    over_tpe: float | None  # the default's median trials over TPE's
    tpe_censored: bool
    # a real-range landscape's
    real_range: bool
    median_le_target: bool
    all_by_target: bool
    beyond_ladder_max: int
    rechecks_max: int
    within_ladder: bool | None  # None where decode is not flat near all cores


class OperatorReplays(TypedDict):
    """Every landscape's replays (``benchmark``), before the targets are judged."""

    seeds: int
    tolerance: float
    budgets: dict[str, int]  # strategy -> trials per replay
    landscapes: dict[str, LandscapeReplays]


class OperatorBenchmark(OperatorReplays, total=False):
    """The benchmark's result (written as JSON, read by ``markdown``): the replays and, once judged, the
    default's targets by landscape."""

    targets: dict[str, LandscapeTargets]


class Objective:
    """One simulated trial per call, request by request, pruned against the incumbent if asked."""

    def __init__(self, land: OperatorLandscape, seed: int, prune: bool):
        self.land, self.seed, self.prune = land, seed, prune
        self.readings: Counter[str] = Counter()
        self.log: list[TrialLog] = []
        self.incumbent: tuple[float, list[dict]] | None = (
            None  # measured tps and samples of the best feasible trial
        )

    def reading_noise(self, config: TrialConfig) -> np.random.Generator:
        """The noise of this configuration's nth measurement in the replay, keyed by the seed, the configuration
        and n, not by what was measured before it. Why: two rules replayed on one seed then read a configuration
        both measure alike (common random numbers), so a paired comparison of rules sees where they went, not a
        noise stream shifted by one trial (one stream per replay moved 73 of 500 held-out replays across the
        budget's end for a rule that changed one trial)."""
        key = json.dumps(config.as_dict(), sort_keys=True, default=str)
        self.readings[key] += 1
        return np.random.default_rng([self.seed, zlib.crc32(key.encode()), self.readings[key]])

    def __call__(self, trial: optuna.Trial) -> tuple[float, ...]:
        land = self.land
        config = suggest(trial, land.space)
        role = store.role_of(trial)
        stage, reason = store.search_note(trial)
        stop = None
        if self.prune and self.incumbent is not None and prunes_on(land.objectives):
            reference = self.incumbent[1]
            planned = REPETITIONS * len(land.prompts)
            stop = lambda samples: should_prune(samples, reference, role, planned, stage).prune  # noqa: E731
        out, m = land.measure(config, self.reading_noise(config), stop)
        base = TrialRecord(number=trial.number, state="RUNNING", role=role, config=config)

        def log(state: str) -> None:
            true = land.true_rate(config) if state == "complete" and out.feasible else 0.0
            self.log.append(TrialLog(config.as_dict(), state, true, m.seconds, stage or role, reason or ""))

        if not out.ok:
            assert out.failure is not None, "a launch that is not ok says why"
            store.write_trial_record(
                trial, replace(base, state="FAIL", failure=Failure(out.failure, "simulated"))
            )
            log("failed")
            raise Failed(out.failure)
        constraint = land.quality_floor - out.quality
        samples = tuple(
            {k: s[k] for k in ("prompt_id", "suite", "repetition", "tokens_per_second")} for s in m.samples
        )
        metrics = Metrics(m.tokens_per_second, m.acceptance, out.quality, 1.0)
        rates = median_over_repetitions(list(samples), pooled_from_rates)[1]
        spread = Spread(len(rates), repetition_cv(rates), None)  # as a study's trial stores it
        trial.set_constraint("quality_floor", constraint)
        load: tuple[dict, ...] = ()
        if m.aggregate is not None:
            assert land.serving is not None, "only a serving landscape measures a level"
            load = ({"users": land.serving.users, "aggregate_tokens_per_second": m.aggregate},)
        record = replace(
            base,
            state="PRUNED" if m.stopped else "COMPLETE",
            metrics=metrics,
            samples=samples,
            spread=spread,
            constraint=constraint,
            load=load,
        )
        store.write_trial_record(trial, record)
        if m.stopped:
            log("pruned")
            raise optuna.TrialPruned()
        log("complete")
        if out.feasible and (self.incumbent is None or m.tokens_per_second > self.incumbent[0]):
            self.incumbent = (m.tokens_per_second, list(m.samples))
        return tuple(record.objective(o) for o in land.objectives)


def replay(
    land: OperatorLandscape,
    strategy: str,
    seed: int,
    budget: int,
    prune: bool,
    earlier: OperatorLandscape | None = None,
) -> list[TrialLog]:
    """What one strategy tried, in order, with each trial's cost. ``warm`` is the default after a
    study of ``earlier`` in the same storage; that study's trials are not counted."""
    storage = optuna.storages.InMemoryStorage()
    if strategy == "warm":
        assert earlier is not None, "run_landscape gives warm replays the earlier study's landscape"
        run_study(
            replace(earlier, name=f"{earlier.name} (earlier)"), "default", seed + 1000, budget, prune, storage
        )
    return run_study(land, strategy, seed, budget, prune, storage)[1]


def run_study(
    land: OperatorLandscape,
    strategy: str,
    seed: int,
    budget: int,
    prune: bool,
    storage: optuna.storages.BaseStorage | None = None,
) -> tuple[optuna.Study, list[TrialLog]]:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = storage or optuna.storages.InMemoryStorage()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (FutureWarning, UserWarning, optuna.exceptions.ExperimentalWarning))
        study = optuna.create_study(
            study_name=land.name,
            storage=storage,
            directions=["maximize"] * len(land.objectives),
            sampler=make_sampler(strategy, seed, budget),
        )
        record = land.study_record(land.objectives)
        store.write_study_record(study, record)
        prior = find_prior(storage, record, land.space) if strategy in ("default", "warm") else None
        if prior:  # as tuner.run.study_start.open_study does
            store.write_prior(study, prior)
        store.enqueue(study, enqueue_params(baseline_config(land.space), land.space), "baseline")
        objective = Objective(land, seed, prune)
        study.optimize(objective, n_trials=budget, catch=(Failed,))
    return study, objective.log


def scores(land: OperatorLandscape, log: list[TrialLog], tolerance: float) -> ReplayScores:
    best = land.optimum[0]
    found, spent, curve, hit, hit_s = 0.0, 0.0, [], None, None
    for t, entry in enumerate(log, start=1):
        found = max(found, entry.true_rate)
        spent += entry.seconds
        curve.append(1.0 - found / best)
        if hit is None and curve[-1] <= tolerance:
            hit, hit_s = t, spent
    return {
        "curve": curve,
        "trials": hit,
        "seconds": hit_s,
        "pruned": sum(e.state == "pruned" for e in log),
        "total_seconds": spent,
        "beyond_ladder": sum(beyond_ladder(e.reason) for e in log),
        "rechecks": sum(e.reason.startswith("threads ") and RECHECK in e.reason for e in log),
    }


RECHECK = "with the final configuration"  # refinement's check of the final configuration's thread neighbours


def beyond_ladder(reason: str) -> bool:
    """A trial of the thread walk past its ladder: a bracket or the SMT probe (``tuner.search.stages.hardware``;
    the ladder and the copy probe's rungs are not, and refinement's check of the final configuration's
    neighbours is counted apart: ``rechecks``)."""
    return (
        reason.startswith("threads ")
        and RECHECK not in reason
        and not any(rung in reason for rung in ("the ladder", "copy probe"))
    )


def _median(values: list) -> float | None:
    """Median counting a miss as infinite; None when more than half missed."""
    m = float(np.median([math.inf if v is None else v for v in values])) if values else math.inf
    return None if math.isinf(m) else m


@dataclass(frozen=True)
class ReplayPlan:
    """What a benchmark replays on each landscape: the strategies over ``seeds`` seeds, the default (and the
    warm start) with ``budget`` trials, the others with ``baseline_budget`` (they need more to be measured at
    all); a seed reaches the target within ``tolerance`` of the best; ``jobs`` replays at once; pruning
    measured with each of ``prune_modes`` (on the default only)."""

    strategies: tuple[str, ...] = STRATEGIES
    seeds: int = 20
    budget: int = 40
    baseline_budget: int = 100
    tolerance: float = TOLERANCE
    jobs: int = 1
    prune_modes: tuple[bool, ...] = (False, True)

    @property
    def budgets(self) -> dict[str, int]:
        return {
            s: (self.budget if s in ("default", "warm") else self.baseline_budget) for s in self.strategies
        }


def run_landscape(
    land: OperatorLandscape, plan: ReplayPlan, earlier: OperatorLandscape | None = None
) -> LandscapeReplays:
    strategies, seeds, budgets = plan.strategies, plan.seeds, plan.budgets
    tolerance, jobs, prune_modes = plan.tolerance, plan.jobs, plan.prune_modes
    land.optimum  # noqa: B018  (computed once, before the workers copy the landscape)
    # pruning is measured on the default only: the others are there for their trial counts
    if earlier is None:
        strategies = tuple(s for s in strategies if s != "warm")
    modes = {s: (prune_modes if s == "default" else (False,)) for s in strategies}
    runs = [(s, seed, p) for s in strategies for p in modes[s] for seed in range(seeds)]
    logs = Parallel(n_jobs=jobs)(
        delayed(replay)(land, s, seed, budgets.get(s, 40), p, earlier) for s, seed, p in runs
    )
    rows: dict[str, dict[str, StrategyFigures]] = {}
    result: LandscapeReplays = {
        "configurations": land.size,
        "optimum": land.optimum[0],
        "best_config": land.optimum[1].as_dict(),
        "best_family": land.optimum[1].family,
        "description": land.description,
        "strategies": rows,
    }
    for strategy in strategies:
        row: dict[str, StrategyFigures] = {}
        for p in modes[strategy]:
            sc = [
                scores(land, log, tolerance)
                for (s, _, pp), log in zip(runs, logs)
                if s == strategy and pp == p
            ]
            budget = budgets.get(strategy, 40)
            row["pruned" if p else "full"] = {
                "trials_to_target": [x["trials"] for x in sc],
                "median_trials": _median([x["trials"] for x in sc]),
                "reached": sum(x["trials"] is not None for x in sc),
                "reached_by_40": sum(x["trials"] is not None and x["trials"] <= 40 for x in sc),
                "worst_trials": None
                if any(x["trials"] is None for x in sc)
                else max(x["trials"] for x in sc),  # type: ignore[type-var]  # no seed missed: every count is set
                "regret_at": {
                    n: float(np.median([x["curve"][min(n, len(x["curve"])) - 1] for x in sc]))
                    for n in CHECKPOINTS
                    if n <= budget
                },
                "median_seconds": _median([x["seconds"] for x in sc]),
                "pruned_trials": float(np.mean([x["pruned"] for x in sc])),
                "beyond_ladder_max": max(x["beyond_ladder"] for x in sc),
                "rechecks_max": max(x["rechecks"] for x in sc),
            }
        rows[strategy] = row
    return result


def benchmark(
    names: tuple[str, ...] = LANDSCAPES,
    plan: ReplayPlan = ReplayPlan(),
    lands: dict[str, OperatorLandscape] | None = None,
) -> OperatorBenchmark:
    """Every strategy on every landscape as ``plan`` says (its seeds and budgets)."""
    lands = lands or landscapes()
    replays: dict[str, LandscapeReplays] = {}
    result: OperatorBenchmark = {
        "seeds": plan.seeds,
        "tolerance": plan.tolerance,
        "budgets": plan.budgets,
        "landscapes": replays,
    }
    for name in names:
        replays[name] = run_landscape(lands[name], plan, earlier=lands.get(WARM_FROM.get(name, "")))
    result["targets"] = targets(result)
    return result


def targets(result: OperatorReplays) -> dict[str, LandscapeTargets]:
    """The targets for the default: median <= 20 trials and every seed by 40 on every landscape, at most a third
    of plain TPE's trials (TPE censored at its budget counts as the budget); on a host's real thread range
    (``REAL_RANGE_LANDSCAPES``), median <= 8 and every seed by 20, and where decode is flat near all cores, at most 3 thread
    trials beyond the ladder."""
    out: dict[str, LandscapeTargets] = {}
    for name, land in result["landscapes"].items():
        d = land["strategies"].get("default", {}).get("full")
        if not d:
            continue
        if name in REAL_RANGE_LANDSCAPES:
            out[name] = real_range_targets(name, d)
            continue
        tpe = land["strategies"].get("tpe", {}).get("full")
        tpe_median = (tpe["median_trials"] or result["budgets"]["tpe"]) if tpe else None
        ratio = None if d["median_trials"] is None or not tpe_median else d["median_trials"] / tpe_median
        out[name] = {
            "median_le_20": d["median_trials"] is not None and d["median_trials"] <= 20,
            "all_by_40": d["reached_by_40"] == result["seeds"],
            "over_tpe": ratio,
            # TPE missed in most seeds: a bound (``bool(tpe)``: a row, not None)
            "tpe_censored": bool(tpe) and tpe["median_trials"] is None,  # type: ignore[index]
            "met": (
                d["median_trials"] is not None
                and d["median_trials"] <= 20
                and d["reached_by_40"] == result["seeds"]
                and (ratio is None or ratio <= 1 / 3)
            ),
        }
    return out


def real_range_targets(name: str, d: StrategyFigures) -> LandscapeTargets:
    """A real-range landscape's targets (see ``targets``)."""
    median, worst = d["median_trials"], d["worst_trials"]
    flat = name in FLAT_NEAR_ALL_CORES
    within_ladder = d["beyond_ladder_max"] <= MAX_BEYOND_LADDER if flat else None
    return {
        "real_range": True,
        "median_le_target": median is not None and median <= REAL_MEDIAN,
        "all_by_target": worst is not None and worst <= REAL_WORST,
        "beyond_ladder_max": d["beyond_ladder_max"],
        "rechecks_max": d["rechecks_max"],
        "within_ladder": within_ladder,
        "met": median is not None
        and median <= REAL_MEDIAN
        and worst is not None
        and worst <= REAL_WORST
        and within_ladder is not False,
    }


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min"


def _trials(r: StrategyFigures | None) -> tuple[str, str]:
    """(median, worst seed) of a row's trials to the tolerance, as printed."""
    if not r:
        return "-", "-"
    median, worst = ("missed" if v is None else f"{v:g}" for v in (r["median_trials"], r["worst_trials"]))
    return median, worst


def summary(result: OperatorBenchmark) -> list[str]:
    """One row per landscape: what wins it and the default's trials to the tolerance (median, worst seed)."""
    tol = f"{result['tolerance']:.0%}"
    lines = [
        f"| landscape | configurations | best is | default: median trials to {tol} | worst seed | "
        "with pruning: median, worst | targets |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, land in result["landscapes"].items():
        row = land["strategies"].get("default", {})
        (median, worst), pruned = _trials(row.get("full")), _trials(row.get("pruned"))
        t = result["targets"].get(name)
        lines.append(
            f"| {name} | {land['configurations']:,} | {land['best_family']} | {median} | {worst} | "
            f"{', '.join(pruned)} | {'-' if not t else 'met' if t['met'] else 'MISSED'} |"
        )
    return lines + [""]


def markdown(result: OperatorBenchmark) -> str:
    """The summary, then per landscape: its best configuration, a row per strategy, and the default's targets."""
    lines = summary(result)
    for name, land in result["landscapes"].items():
        lines += _landscape_section(result, name, land)
    return "\n".join(lines)


def _landscape_section(result: OperatorBenchmark, name: str, land: LandscapeReplays) -> list[str]:
    """One landscape: what it is and its best, the strategies' table, what ``warm`` followed, the targets."""
    tol = f"{result['tolerance']:.0%}"
    cfg = " ".join(f"{k}={v}" for k, v in land["best_config"].items())
    lines = [
        f"**{name}**: {land['description']}; {land['configurations']} configurations, "
        f"best {land['optimum']:.2f} t/s ({cfg})",
        "",
    ]
    head = [
        "strategy",
        f"median trials to {tol}",
        "seeds reached (by 40)",
        "regret@10",
        "regret@20",
        "regret@40",
        f"median time to {tol}",
        "... with pruning",
        "pruned trials/run",
    ]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [_strategy_row(result, strategy, row) for strategy, row in land["strategies"].items()]
    if "warm" in land["strategies"]:
        lines += [
            "",
            f"warm: the default in a storage that already holds a study of {WARM_FROM[name]} on this "
            "host (tuner.search.prior; that study's trials are not counted).",
        ]
    t = result["targets"].get(name)
    if t:
        lines += ["", _targets_line(t)]
    lines.append("")
    return lines


def _strategy_row(result: OperatorBenchmark, strategy: str, row: dict[str, StrategyFigures]) -> str:
    """A strategy's trials to the tolerance, seeds that reached it, regret at the checkpoints, time with and
    without pruning (pruning is measured on the default only)."""
    full, pruned = row.get("full"), row.get("pruned")
    r = full or pruned
    assert r is not None, "every strategy is replayed in at least one mode"
    n = len(r["trials_to_target"])
    median = (
        f"{r['median_trials']:g}" if r["median_trials"] is not None else f"> {result['budgets'][strategy]}"
    )
    regrets = [f"{r['regret_at'][c]:.1%}" if c in r["regret_at"] else "-" for c in CHECKPOINTS]
    cells = [
        strategy,
        median,
        f"{r['reached']}/{n} ({r['reached_by_40']})",
        *regrets,
        _fmt_s(full["median_seconds"]) if full else "-",
        _pruned_time(pruned) if pruned else "-",
        f"{pruned['pruned_trials']:.1f}" if pruned else "-",
    ]
    return "| " + " | ".join(cells) + " |"


def _pruned_time(pruned: StrategyFigures) -> str:
    """Median time to the tolerance with pruning, and its median trials when there is one."""
    return _fmt_s(pruned["median_seconds"]) + (
        f" ({pruned['median_trials']:g} trials)" if pruned["median_trials"] is not None else ""
    )


def _targets_line(t: LandscapeTargets) -> str:
    """The default against its targets (see ``targets``); a TPE ratio against a censored TPE is a bound."""
    if t.get("real_range"):
        flat = (
            f", the thread walk's trials beyond its ladder at most {t['beyond_ladder_max']} "
            f"(target <= {MAX_BEYOND_LADDER}): {'yes' if t['within_ladder'] else 'NO'} (and at most "
            f"{t['rechecks_max']} checks of the final configuration's neighbours, refinement's)"
            if t["within_ladder"] is not None
            else ""
        )
        return (
            f"default on the host's real thread range: median <= {REAL_MEDIAN} {'yes' if t['median_le_target'] else 'NO'}, "
            f"every seed by {REAL_WORST} {'yes' if t['all_by_target'] else 'NO'}{flat}: {'met' if t['met'] else 'MISSED'}"
        )
    ratio = "n/a" if t["over_tpe"] is None else f"{'<= ' if t['tpe_censored'] else ''}{t['over_tpe']:.2f}"
    return (
        f"default: median <= 20 {'yes' if t['median_le_20'] else 'NO'}, every seed by 40 "
        f"{'yes' if t['all_by_40'] else 'NO'}, default / TPE trials {ratio} (target <= 0.33): "
        f"{'met' if t['met'] else 'MISSED'}"
    )
