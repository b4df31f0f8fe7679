"""`python -m benchmarks bench-search TABLE`: replay a recorded grid as a tabular benchmark of samplers.

Why: a tuner is judged by how few trials it needs to find the best configuration, and
measuring that on hardware takes hours per seed. A recorded grid answers it in
seconds: the replay objective looks the suggested configuration up and returns its
recorded objectives, tokens/s with Gaussian noise of the recorded spread (cv), so a
sampler sees what a study on that machine would have seen.

The space is the table's: each parameter column is a categorical of its values, asked
in column order and only where it applies (a column empty in every row that agrees
with the choices so far is not asked: no draft without speculation), the way
``tuner.search.space.suggest`` asks. A configuration the table lacks or recorded as failed is a
failed trial: in a study it would have cost a launch too.

Every strategy starts with the table's first row, as every study starts with its
baseline (``python -m benchmarks record-grid`` writes the baseline first); the grid goes on in table
order. Strategies: ``default`` is the project's sampler (``tuner.search.sampling.sampler_for("structured")``
with the replay's length as its budget); ``today`` the default before it (the no-repeat
wrapper around TPE, ``sampler_for("tpe")``), which the default must not do worse than;
``tpe`` is Optuna's TPE with its own defaults; ``nsga2`` the project's NSGA-II settings;
``random``; ``grid`` the table's rows in order, which for a record-grid table is
llama-bench's order. Each replayed trial writes the record a study writes (metrics,
constraint, the table's failure reason), so samplers that plan from records see it.

Scores per replay: regret after t trials, 1 - best feasible tokens/s tried so far /
best feasible tokens/s of the table (recorded values: noise steers the sampler, it
does not move the target), and the trials until that regret is within the tolerance.
Replays are independent and CPU-bound, so they run in parallel (joblib).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Any, TypedDict, cast

import numpy as np
import optuna
import pandas as pd
from joblib import Parallel, delayed

from benchmarks.table import parameter_columns
from tuner.errors import UserError
from tuner.knobs.registry import SPEC_TYPES_WITH_K
from tuner.machine.fingerprint import Fingerprint
from tuner.storage import store
from tuner.storage.records import Failure, Metrics, StudyRecord, TrialRecord, config_from_dict, digest

STRATEGIES = ("default", "today", "tpe", "nsga2", "random", "grid")
DEFAULT_OBJECTIVES = ("tokens_per_second", "acceptance", "quality")  # a study's default objectives
TOLERANCE = 0.03
# knobs the default sampler's ``suggest`` asks wherever they apply: one value in every row is still asked
ASKED = ("spec_type", "draft", "draft_max", "numa_node", "threads")


@dataclass(frozen=True)
class Entry:
    """One recorded configuration."""

    ok: bool  # measured; False for a failed launch or run
    tokens_per_second: float
    values: tuple[float, ...]  # the replay's objectives, in Landscape.objectives order
    cv: float
    feasible: bool
    constraint: float  # as a study sets it (quality floor - quality): feasible when <= 0
    failure: str | None = None  # the recorded failure reason (the table's status) when not ok


@dataclass(frozen=True)
class Landscape:
    """A recorded table as a search space plus a look-up."""

    params: tuple[str, ...]
    domains: dict[str, tuple]
    entries: dict[tuple, Entry]  # by key: one value per parameter, None where it does not apply
    order: tuple[tuple, ...]  # keys in table order
    objectives: tuple[str, ...]

    @property
    def best(self) -> float:
        return max((e.tokens_per_second for e in self.entries.values() if e.ok and e.feasible), default=0.0)

    def best_key(self) -> tuple:
        return max(
            (k for k, e in self.entries.items() if e.ok and e.feasible),
            key=lambda k: self.entries[k].tokens_per_second,
        )

    def config(self, key: tuple) -> dict[str, Any]:
        return {p: v for p, v in zip(self.params, key) if v is not None}


def replay_record(
    name: str,
    space: dict,
    objectives: tuple[str, ...],
    fingerprint: Fingerprint | None = None,
    target: dict | None = None,
    workload: dict | None = None,
    drafts: dict[str, dict] | None = None,
) -> StudyRecord:
    """A benchmark replay's study record: its space and objectives (and, for a modelled host, the machine,
    target and workload the warm start matches on, the models' weight bytes the probes read); no build."""
    return StudyRecord(
        name=name,
        created_by="replay",
        fingerprint=fingerprint or {},
        build={},
        target=target or {},
        drafts=drafts or {},
        space=space,
        space_digest=digest(space),
        space_notes=(),
        objectives=tuple(objectives),
        quality={},
        spec_path="",
        workload=workload or {},
        measurement={},
    )


def _column_values(column: pd.Series) -> list[Any]:
    """Plain Python values, None where empty; whole-number floats as ints (CSV reads an int
    column with gaps as float) only when the whole column is whole numbers."""
    values = [None if pd.isna(v) else (v.item() if hasattr(v, "item") else v) for v in column]
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, float) and v.is_integer() for v in present):
        return [None if v is None else int(v) for v in values]
    return values


def load_landscape(
    frame: pd.DataFrame, params: list[str] | None = None, objectives: list[str] | None = None
) -> Landscape:
    """A table as a landscape; a table the replay cannot use is a UserError naming the column."""
    if "tokens_per_second" not in frame.columns:
        raise UserError("the table has no tokens_per_second column; the benchmark scores decode speed")
    params = parameter_columns(frame, params)
    params += [k for k in ASKED if k in frame.columns and k not in params and frame[k].notna().all()]
    objectives = list(objectives or [c for c in DEFAULT_OBJECTIVES if c in frame.columns])
    missing = [c for c in objectives if c not in frame.columns]
    if missing:
        raise UserError(f"--objectives: {missing[0]!r} is not a column of the table")
    keys = list(zip(*(_column_values(frame[p]) for p in params)))
    ok = frame["tokens_per_second"].notna()
    if "status" in frame.columns:
        ok &= frame["status"].fillna("ok") == "ok"
    if {"quality", "quality_floor"} <= set(frame.columns):
        constraint = (frame["quality_floor"] - frame["quality"]).fillna(1.0)
    elif "feasible" in frame.columns:
        constraint = (~frame["feasible"].fillna(False).astype(bool)).astype(float)
    else:
        constraint = pd.Series(0.0, frame.index)
    feasible = (
        frame["feasible"].fillna(False).astype(bool) if "feasible" in frame.columns else constraint <= 0
    )
    cv = frame["cv"].fillna(0.0) if "cv" in frame.columns else pd.Series(0.0, frame.index)
    entries: dict[tuple, Entry] = {}
    for i, key in enumerate(keys):
        if key in entries:
            raise UserError(
                f"rows {keys.index(key) + 1} and {i + 1} record the same configuration {dict(zip(params, key))}"
            )
        values = tuple(float(frame[c].iloc[i]) if ok.iloc[i] else 0.0 for c in objectives)
        status = frame["status"].iloc[i] if "status" in frame.columns and not ok.iloc[i] else None
        entries[key] = Entry(
            bool(ok.iloc[i]),
            float(frame["tokens_per_second"].iloc[i]) if ok.iloc[i] else 0.0,
            values,
            float(cv.iloc[i]),
            bool(feasible.iloc[i]),
            float(constraint.iloc[i]),
            None if ok.iloc[i] else (str(status) if isinstance(status, str) else "unknown"),
        )
    _check_conditional(params, keys)
    domains = {p: tuple(sorted({k[i] for k in keys if k[i] is not None})) for i, p in enumerate(params)}
    landscape = Landscape(tuple(params), domains, entries, tuple(keys), tuple(objectives))
    if landscape.best <= 0:
        raise UserError("the table has no measured feasible configuration: nothing to find")
    return landscape


def _check_conditional(params: list[str], keys: list[tuple]) -> None:
    """Each column is set in all or none of the rows that agree on the columns before it."""
    for i, name in enumerate(params):
        set_by_prefix: dict[tuple, set[bool]] = {}
        for key in keys:
            set_by_prefix.setdefault(key[:i], set()).add(key[i] is None)
        mixed = next((prefix for prefix, kinds in set_by_prefix.items() if len(kinds) > 1), None)
        if mixed is not None:
            where = dict(zip(params, mixed))
            raise UserError(
                f"column {name!r} is empty in some rows and set in others with {where}; "
                "order the parameter columns so a knob follows the one it depends on (--params)"
            )


def check_for_default(landscape: Landscape) -> None:
    """The default sampler plans through ``tuner.search.space.suggest``, which asks these knobs wherever a
    study would: a table without one is one line naming the column, not a KeyError in a replay worker."""
    rows = [landscape.config(k) for k in landscape.order]
    needed = {
        "spec_type": "every configuration has one (none: the target alone)",
        "threads": "every configuration has one",
        "draft": "rows with spec_type draft-simple",
        "draft_max": "rows with a speculative type that drafts K tokens",
        "numa_node": "rows with numa bind (the node they bind to: 0 on a one-node host)",
    }
    wanted = {
        "spec_type": True,
        "threads": True,
        "draft": any(r.get("spec_type") == "draft-simple" for r in rows),
        "draft_max": any(r.get("spec_type") in SPEC_TYPES_WITH_K for r in rows),
        "numa_node": any(r.get("numa") == "bind" for r in rows),
    }
    missing = next((k for k, want in wanted.items() if want and k not in landscape.params), None)
    if missing is not None:
        raise UserError(
            f"column {missing!r}: not among the table's parameters, and the default sampler asks it for "
            f"{needed[missing]}; add the column to the table (or to --params), or leave default out of "
            "--strategies"
        )


class NotRecorded(Exception):
    """The suggested configuration has no measurement in the table."""


class ReplayObjective:
    """Look up the suggested configuration; tokens/s gets Gaussian noise of its recorded cv."""

    def __init__(self, landscape: Landscape, rng: np.random.Generator):
        self.landscape = landscape
        self.rng = rng

    def ask(self, trial: optuna.Trial) -> tuple:
        land = self.landscape
        candidates = list(land.order)
        key = []
        for i, name in enumerate(land.params):
            value = None
            if any(k[i] is not None for k in candidates):
                value = trial.suggest_categorical(name, list(land.domains[name]))
            key.append(value)
            candidates = [k for k in candidates if k[i] == value]
        return tuple(key)

    def __call__(self, trial: optuna.Trial) -> tuple[float, ...]:
        key = self.ask(trial)
        trial.set_user_attr("key", list(key))
        entry = self.landscape.entries.get(key)
        base = TrialRecord(
            number=trial.number,
            state="RUNNING",
            role=store.role_of(trial),
            config=config_from_dict(self.landscape.config(key)),
        )
        if entry is None or not entry.ok:  # a study records why; the structured sampler blames it
            reason = "not_recorded" if entry is None else entry.failure
            assert reason is not None, "a recorded configuration that is not ok has its failure reason"
            store.write_trial_record(
                trial, replace(base, state="FAIL", failure=Failure(reason, "replayed from the table"))
            )
            raise NotRecorded(str(key))
        trial.set_constraint("quality_floor", entry.constraint)
        noise = max(0.0, 1.0 + entry.cv * self.rng.standard_normal())
        values = list(entry.values)
        for i, name in enumerate(self.landscape.objectives):
            if name == "tokens_per_second":
                values[i] *= noise
        named = dict(zip(self.landscape.objectives, values))
        # what a study's record holds, so samplers that read records (the structured one) see the trial
        store.write_trial_record(
            trial,
            replace(
                base,
                state="COMPLETE",
                constraint=entry.constraint,
                metrics=Metrics(
                    named.get("tokens_per_second", entry.tokens_per_second * noise),
                    named.get("acceptance", 0.0),
                    named.get("quality", 1.0),
                    1.0,
                ),
            ),
        )
        return tuple(values)


def make_sampler(strategy: str, seed: int, budget: int) -> optuna.samplers.BaseSampler:
    from tuner.search.sampling import sampler_for

    if strategy == "default":
        return sampler_for("structured", seed, budget)
    if strategy == "today":  # the default before the structured sampler: NoRepeatSampler(TPE)
        return sampler_for("tpe", seed, budget)
    if strategy == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    return sampler_for(strategy, seed, budget)


def replay(landscape: Landscape, strategy: str, seed: int, budget: int) -> list[tuple]:
    """The configurations one strategy tries, in order, for ``budget`` trials."""
    if strategy == "grid":
        return list(landscape.order[:budget])
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # runs in a joblib worker: silence per process
    with warnings.catch_warnings():  # Optuna's deprecation notices, once per replay, would drown the table
        warnings.simplefilter("ignore", (FutureWarning, optuna.exceptions.ExperimentalWarning))
        study = optuna.create_study(
            directions=["maximize"] * len(landscape.objectives), sampler=make_sampler(strategy, seed, budget)
        )
        # what a study records for its sampler: the space (here the table's choices) and the objectives
        space = {p: ["Choices", {"values": list(landscape.domains[p])}] for p in landscape.params}
        store.write_study_record(study, replay_record("replay", space, tuple(landscape.objectives)))
        store.enqueue(study, landscape.config(landscape.order[0]), "baseline")  # as in a study
        study.optimize(
            ReplayObjective(landscape, np.random.default_rng(seed)), n_trials=budget, catch=(NotRecorded,)
        )
    return [tuple(t.user_attrs["key"]) for t in study.trials]


def regret_curve(landscape: Landscape, keys: list[tuple]) -> list[float]:
    """Regret after each trial: how far the best feasible configuration tried is from the best."""
    best, found, curve = landscape.best, 0.0, []
    for key in keys:
        entry = landscape.entries.get(key)
        if entry is not None and entry.ok and entry.feasible:
            found = max(found, entry.tokens_per_second)
        curve.append(1.0 - found / best)
    return curve


def trials_to(curve: list[float], tolerance: float) -> int | None:
    return next((t + 1 for t, r in enumerate(curve) if r <= tolerance), None)


@dataclass(frozen=True)
class StrategyResult:
    strategy: str
    trials_to_target: list[int | None]  # per seed; None: not within the tolerance in the budget
    median_trials: float | None  # None: more than half the seeds did not get there
    reached: int
    median_regret_at: dict[int, float]


class StrategyResultJson(TypedDict):
    """A ``StrategyResult`` as the benchmark's result holds it (``asdict``)."""

    strategy: str
    trials_to_target: list[int | None]
    median_trials: float | None
    reached: int
    median_regret_at: dict[int, float]


class ReplayTargets(TypedDict, total=False):
    """The default against its targets (``targets``); empty without both the default and random replayed."""

    default_over_random: float | None  # an upper bound when ``random_censored``
    random_censored: bool
    default_over_grid_size: float | None
    no_worse_than_today: bool | None  # None without today's default replayed
    met: bool


class ReplayFigures(TypedDict):
    """What ``benchmark`` finds: the grid, each strategy, the targets."""

    configurations: int
    feasible: int
    within_tolerance: int  # feasible configurations within the tolerance of the best
    best_tokens_per_second: float
    best_config: dict[str, Any]
    params: list[str]
    objectives: list[str]
    budget: int
    seeds: int
    tolerance: float
    strategies: dict[str, StrategyResultJson]
    targets: ReplayTargets


class ReplayBenchmark(ReplayFigures, total=False):
    """The benchmark's result (written as JSON, read by ``markdown``), with the table it replayed once its
    caller names it."""

    table: str  # the recorded grid's file


def summarize_strategy(
    strategy: str, curves: list[list[float]], tolerance: float, checkpoints: list[int]
) -> StrategyResult:
    hits = [trials_to(c, tolerance) for c in curves]
    median = float(np.median([math.inf if h is None else h for h in hits]))
    return StrategyResult(
        strategy=strategy,
        trials_to_target=hits,
        median_trials=None if math.isinf(median) else median,
        reached=sum(h is not None for h in hits),
        median_regret_at={n: float(np.median([c[min(n, len(c)) - 1] for c in curves])) for n in checkpoints},
    )


def benchmark(
    landscape: Landscape,
    *,
    strategies: tuple[str, ...] = STRATEGIES,
    seeds: int = 10,
    budget: int | None = None,
    tolerance: float = TOLERANCE,
    jobs: int = -1,
) -> ReplayBenchmark:
    """Replay every strategy over ``seeds`` seeds; the grid, being deterministic, once."""
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise UserError(f"--strategies: unknown {unknown[0]!r}; use some of {', '.join(STRATEGIES)}")
    if seeds < 1:
        raise UserError(f"--seeds: must be >= 1, got {seeds}")
    if "default" in strategies:
        check_for_default(landscape)
    size = len(landscape.order)
    budget = budget or size
    runs = [(s, seed) for s in strategies for seed in (range(1) if s == "grid" else range(seeds))]
    keys = Parallel(n_jobs=jobs)(delayed(replay)(landscape, s, seed, budget) for s, seed in runs)
    checkpoints = sorted({n for n in (5, 10, 20) if n < budget} | {budget})
    results = {}
    for strategy in strategies:
        curves = [regret_curve(landscape, k) for (s, _), k in zip(runs, keys) if s == strategy]
        results[strategy] = summarize_strategy(strategy, curves, tolerance, checkpoints)
    best = landscape.best
    return {
        "configurations": size,
        "feasible": sum(e.ok and e.feasible for e in landscape.entries.values()),
        "within_tolerance": sum(
            e.ok and e.feasible and e.tokens_per_second >= best * (1 - tolerance)
            for e in landscape.entries.values()
        ),
        "best_tokens_per_second": best,
        "best_config": landscape.config(landscape.best_key()),
        "params": list(landscape.params),
        "objectives": list(landscape.objectives),
        "budget": budget,
        "seeds": seeds,
        "tolerance": tolerance,
        "strategies": {name: cast(StrategyResultJson, asdict(r)) for name, r in results.items()},
        "targets": targets(results, size, budget),
    }


def targets(results: dict[str, StrategyResult], size: int, budget: int) -> ReplayTargets:
    """The targets the default search must meet: within the tolerance in at most half the trials
    random search needs (medians over seeds) and at most a quarter of the grid. When random
    search did not get there in most seeds, its median is taken as the budget, so the
    ratio is an upper bound."""
    default = results.get("default")
    random = results.get("random")
    if default is None or random is None:
        return {}
    d = default.median_trials
    vs_random = None if d is None else d / (random.median_trials or budget)
    vs_grid = None if d is None else d / size
    today = results.get("today")
    # "no worse than today": the median, and the seeds that got there at all
    vs_today = (
        None
        if today is None
        else (d is not None and d <= (today.median_trials or budget) and default.reached >= today.reached)
    )
    return {
        "default_over_random": vs_random,
        "random_censored": random.median_trials is None,
        "default_over_grid_size": vs_grid,
        "no_worse_than_today": vs_today,
        "met": (
            vs_random is not None
            and vs_grid is not None  # both None when the default did not get there
            and vs_random <= 0.5
            and vs_grid <= 0.25
            and vs_today is not False
        ),
    }


def markdown(result: ReplayBenchmark) -> str:
    """A short table: one row per strategy, then the targets."""
    tol = f"{result['tolerance']:.0%}"
    checkpoints = next(iter(result["strategies"].values()))["median_regret_at"]
    head = ["strategy", f"median trials to {tol}", "reached"] + [f"regret@{n}" for n in checkpoints]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in result["strategies"].items():
        median = f"{r['median_trials']:g}" if r["median_trials"] is not None else f"> {result['budget']}"
        seeds = len(r["trials_to_target"])
        cells = [name, median, f"{r['reached']}/{seeds}"] + [
            f"{v:.1%}" for v in r["median_regret_at"].values()
        ]
        lines.append("| " + " | ".join(cells) + " |")
    t = result["targets"]
    lines.append("")
    lines.append(
        f"{result['configurations']} configurations, {result['feasible']} feasible, "
        f"{result['within_tolerance']} within {tol} of the best ({result['best_tokens_per_second']:.1f} t/s: "
        f"{result['best_config']}); budget {result['budget']} trials, {result['seeds']} seeds."
    )
    if t:
        ratio = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
        bound = "<= " if t["random_censored"] else ""
        today = {
            None: "",
            True: "; no worse than today's default (median and seeds reached): yes",
            False: "; no worse than today's default (median and seeds reached): NO",
        }[t.get("no_worse_than_today")]
        lines.append(
            f"default / random: {bound}{ratio(t['default_over_random'])} (target <= 0.5); "
            f"default / grid size: {ratio(t['default_over_grid_size'])} (target <= 0.25){today}: "
            f"{'met' if t['met'] else 'MISSED'}"
        )
    return "\n".join(lines) + "\n"
