"""A study's trials as pandas frames, fronts, effects, roofline: the data of reports and exports.

Everything here returns data; ``tuner.output.report_html`` turns it into one self-contained
HTML page and ``tuner.output.report`` is the command. Keeping the two apart lets tests assert on numbers, and lets export and
compare reuse the same frame (one row per trial, knobs from the stored ``config``,
objectives from ``metrics``).

The roofline is what operators reason with: decode without speculation streams the
weights once per token, so it cannot beat memory bandwidth / bytes read per token (for
MoE: the shared weights plus the active experts' share). Each trial's tokens/s is shown
as a fraction of that ceiling; speculation is how a trial gets above 1.
"""

from __future__ import annotations

import math
import re
import shlex
import warnings
from dataclasses import dataclass, field
from typing import Any

import optuna
import pandas as pd

from tuner.decisions import load_race
from tuner.decisions.drift import PRIOR_LAUNCH_SIGMA, REFERENCE_ROLES, DisturbedBaseline, Sentinels, midpoint
from tuner.decisions.front import feasible, front_2d, pareto_mask
from tuner.decisions.per_type import PerTypeResult
from tuner.decisions.race import RaceResult, users_text
from tuner.knobs.config import method_of
from tuner.knobs.registry import INT_KNOBS, SOURCE_QUANT
from tuner.knobs.registry import NAMES as KNOB_NAMES
from tuner.machine.bandwidth import BandwidthCurve, curve_of
from tuner.machine.host import host_was_busy
from tuner.machine.roofline import Bandwidth, Roofline, study_bandwidth, study_roofline
from tuner.measurement.measure import per_source, prompt_rate
from tuner.output.turns import speedup_by_turn
from tuner.search.structured_sampler import fitted_models, unprobed
from tuner.storage import store
from tuner.storage.records import StudyRecord, TrialRecord, WarmStartPrior

METRICS = ("tokens_per_second", "acceptance", "quality", "speedup")
COLUMNS = (
    "trial",
    "state",
    "role",
    "feasible",
    "method",
    "family",
    *KNOB_NAMES,
    *METRICS,
    "recorded_speedup",
    "drifted",
    "host_busy",
    "unpinned",
    "placement_problem",
    "pruned",
    "search_stage",
    "cv",
    "noisy",
    "drafted",
    "accepted",
    "constraint_quality",
    "failure_reason",
    "failure_detail",
    "duration_s",
    "command",
    "roofline_tokens_per_second",
    "roofline_fraction",
)


# ------------------------------------------------------------------ the trials frame


def trials_frame(
    records: list[TrialRecord], roofline: Roofline | None = None, noise_cv: float = 0.10
) -> pd.DataFrame:
    """One row per finished trial record: knobs, figures, per-suite t/s, roofline share.

    ``speedup`` divides by the worker's sentinel rate interpolated at the trial's time
    (tuner.decisions.drift); ``recorded_speedup`` is what the trial knew then (its latest reference)."""
    sentinels = Sentinels(records, noise_cv)
    rows = []
    for record in records:
        config = record.config.as_dict()
        metrics = record.metrics
        at = midpoint(record)
        row = {
            "trial": record.number,
            "state": record.state,
            "role": record.role,
            "feasible": record.feasible,
            "method": method_of(config),
            "family": record.config.family,
            **{k: config.get(k) for k in KNOB_NAMES},
            **{name: getattr(metrics, name) if metrics else None for name in METRICS},
            "recorded_speedup": metrics.speedup if metrics else None,
            "drifted": sentinels.drifted(record.worker, at) if at is not None else None,
            "host_busy": host_was_busy(record.host) if record.host else None,
            "unpinned": record.host.get("unpinned") if record.host else None,
            "placement_problem": record.host.get("placement_problem") if record.host else None,
            "thp_mode": record.host.get("thp_mode") if record.host else None,
            **memory_mib(record.host),
            "pruned": record.pruned,
            "search_stage": record.search.get("stage"),
            "cv": record.spread.cv if record.spread else None,
            "noisy": record.spread.noisy if record.spread else None,
            "drafted": record.drafted,
            "accepted": record.accepted,
            "prompt_tokens_per_second": prompt_rate(record.samples),
            "constraint_quality": record.constraint,
            **{f"score_{k}": v for k, v in record.scores.items()},  # a scorer's figures besides quality (kld)
            **{f"tps_{s}": v for s, v in record.per_suite_tokens_per_second.items()},
            **record.load_figures(),  # aggregate tokens/s and latency percentiles per concurrency level: p95_ttft_ms_c4
            **{f"constraint_{k}": v for k, v in record.constraints.items()},
            "failure_reason": record.failure.reason if record.failure else None,
            "failure_detail": record.failure.detail if record.failure else None,
            "duration_s": record.duration_s,
            "command": shlex.join(record.argv) if record.argv else None,
        }
        if record.complete and sentinels.speedup(record) is not None:
            row["speedup"] = sentinels.speedup(record)
        rows.append({**row, **_roofline_columns(roofline, record)})
    frame = pd.DataFrame(rows)
    for column in COLUMNS:  # a study without (complete) trials still has every column
        if column not in frame:
            frame[column] = pd.Series(dtype=bool if column == "feasible" else float)
    for knob in INT_KNOBS:
        frame[knob] = frame[knob].astype("Int64")
    return frame


def _roofline_columns(roofline: Roofline | None, record: TrialRecord) -> dict:
    """The trial's decode ceiling and its share of it: for the source target only (the study's roofline is the
    source's bytes; a quantized variant reads fewer)."""
    if roofline is None or record.metrics is None or record.config.target_quant not in (None, SOURCE_QUANT):
        return {}
    ceiling = roofline.tokens_per_second(record.config.experts)
    return {
        "roofline_tokens_per_second": ceiling,
        "roofline_fraction": record.metrics.tokens_per_second / ceiling,
    }


# The server's memory after its workload (/proc/PID/smaps_rollup), in MiB: which pages were huge.
MEMORY_COLUMNS = {
    "Rss": "rss_mib",
    "AnonHugePages": "anon_huge_mib",
    "FilePmdMapped": "file_huge_mib",
    "Locked": "locked_mib",
}


def memory_mib(host: dict) -> dict[str, float]:
    kib = (host or {}).get("smaps_kib") or {}
    return {column: kib[name] / 1024 for name, column in MEMORY_COLUMNS.items() if name in kib}


def suites_of(frame: pd.DataFrame) -> list[str]:
    return [c.removeprefix("tps_") for c in frame.columns if c.startswith("tps_")]


def complete(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["state"] == "COMPLETE"]


# ------------------------------------------------------------------ fronts


def pareto_front(study: optuna.Study, record: StudyRecord, frame: pd.DataFrame) -> pd.DataFrame:
    """The feasible trials no feasible trial beats on every objective, fastest first."""
    pool = feasible(frame)
    if pool.empty:
        return pool
    objectives = list(record.objectives)
    maximize = [d == optuna.study.StudyDirection.MAXIMIZE for d in study.directions]
    front = pool[pareto_mask(pool, objectives, maximize)]
    return front.sort_values("tokens_per_second", ascending=False)


# ------------------------------------------------------------------ effects


def k_by_method(frame: pd.DataFrame) -> pd.DataFrame:
    """Best feasible tokens/s per (drafting method, K); no speculation is K = 0."""
    pool = feasible(frame).assign(K=lambda f: f["draft_max"].fillna(0).astype(int))
    if pool.empty:
        return pd.DataFrame(columns=["method", "K", "tokens_per_second", "acceptance", "trials"])
    return pool.groupby(["method", "K"], as_index=False).agg(
        tokens_per_second=("tokens_per_second", "max"),
        acceptance=("acceptance", "mean"),
        trials=("trial", "count"),
    )


def per_suite_long(frame: pd.DataFrame) -> pd.DataFrame:
    """Feasible trials' per-content-type tokens/s, one row per (trial, suite)."""
    suites = suites_of(frame)
    pool = feasible(frame)
    if pool.empty or not suites:
        return pd.DataFrame(columns=["trial", "suite", "tokens_per_second"])
    keep = ["trial", "method", "spec_type", "draft", "draft_max", "temperature"]
    long = pool.melt(
        id_vars=keep,
        value_vars=[f"tps_{s}" for s in suites],
        var_name="suite",
        value_name="suite_tokens_per_second",
    ).dropna(subset=["suite_tokens_per_second"])
    long["suite"] = long["suite"].str.removeprefix("tps_")
    return long.rename(columns={"suite_tokens_per_second": "tokens_per_second"})


def k_by_suite(frame: pd.DataFrame) -> pd.DataFrame:
    """Best feasible tokens/s per (content type, K); no speculation is K = 0."""
    long = per_suite_long(frame)
    if long.empty:
        return pd.DataFrame(columns=["suite", "K", "tokens_per_second"])
    long["K"] = long["draft_max"].fillna(0).astype(int)
    return long.groupby(["suite", "K"], as_index=False).agg(tokens_per_second=("tokens_per_second", "max"))


def best_per_suite(frame: pd.DataFrame) -> pd.DataFrame:
    """For each content type, the feasible trial fastest on it, with its K and temperature."""
    long = per_suite_long(frame)
    if long.empty:
        return long
    best = long.loc[long.groupby("suite")["tokens_per_second"].idxmax()]
    return best[
        ["suite", "trial", "tokens_per_second", "method", "spec_type", "draft", "draft_max", "temperature"]
    ].reset_index(drop=True)


FAMILIES = ("draft", "lookup", "stack")
FAMILY_COLUMNS = [
    "suite",
    "family",
    "trial",
    "method",
    "K",
    "tokens_per_second",
    "speedup",
    "sources",
    "lookup_share",
]


def families_by_suite(frame: pd.DataFrame, records: list[TrialRecord]) -> pd.DataFrame:
    """Per content type, the best feasible draft-only, lookup-only and stacked trial on it, with what
    each speculative source drafted and had accepted on that type's requests: how much of a stack's
    gain came from lookup and how much from the draft model."""
    if frame.empty:
        return pd.DataFrame(columns=FAMILY_COLUMNS)
    by_number = {r.number: r for r in records}
    base = frame[(frame["role"] == "baseline") & frame["feasible"].fillna(False).astype(bool)]
    rows = []
    for suite in suites_of(frame):
        column = f"tps_{suite}"
        baseline = (
            base[column].dropna().iloc[0] if column in base and not base[column].dropna().empty else None
        )
        for family in FAMILIES:
            pool = feasible(frame)
            pool = (
                pool[(pool["family"] == family) & pool[column].notna()] if column in pool else pool.iloc[0:0]
            )
            if pool.empty:
                continue
            best = pool.loc[pool[column].idxmax()]
            sources = per_source(s for s in by_number[int(best["trial"])].samples if s.get("suite") == suite)
            accepted = sum(a for _, a in sources.values())
            lookup_accepted = sum(a for name, (_, a) in sources.items() if name.startswith("ngram"))
            rows.append(
                {
                    "suite": suite,
                    "family": family,
                    "trial": int(best["trial"]),
                    "method": best["method"],
                    "K": best["draft_max"],
                    "tokens_per_second": best[column],
                    "speedup": best[column] / baseline if baseline else None,
                    "sources": "; ".join(
                        f"{name} {a}/{d} ({a / d:.0%})" if d else f"{name} 0/0"
                        for name, (d, a) in sources.items()
                    )
                    or "not recorded",
                    "lookup_share": lookup_accepted / accepted if accepted else None,
                }
            )
    return pd.DataFrame(rows, columns=FAMILY_COLUMNS)


LEVEL_COLUMN = re.compile(r"^aggregate_tokens_per_second_c(\d+)$")


def levels_of(frame: pd.DataFrame) -> list[int]:
    """The concurrency levels the trials were measured at (their aggregate tokens/s columns), fewest first."""
    return sorted(int(m.group(1)) for c in frame.columns if (m := LEVEL_COLUMN.match(c)))


LATENCY_COLUMNS = ("p50_ttft_ms", "p95_ttft_ms", "p50_tpot_ms", "p95_tpot_ms")
CONCURRENCY_COLUMNS = ["family", "users", "aggregate_tokens_per_second", "trial", *LATENCY_COLUMNS]


def by_concurrency(frame: pd.DataFrame) -> pd.DataFrame:
    """Per family (none, draft, lookup, stack) and level, the best feasible aggregate tokens/s, its trial, and
    that trial's time to first token and time per output token at the level (p50, p95)."""
    rows = []
    pool = feasible(frame) if not frame.empty else frame
    for users in levels_of(frame):
        column = f"aggregate_tokens_per_second_c{users}"
        for family, group in pool.dropna(subset=[column]).groupby("family"):
            best = group.loc[group[column].idxmax()]
            rows.append(
                {
                    "family": family,
                    "users": users,
                    "aggregate_tokens_per_second": best[column],
                    "trial": int(best["trial"]),
                    **{m: best.get(f"{m}_c{users}") for m in LATENCY_COLUMNS},
                }
            )
    return pd.DataFrame(rows, columns=CONCURRENCY_COLUMNS)


def baseline_readings(records: list[TrialRecord], noise_cv: float) -> tuple[DisturbedBaseline | None, str]:
    """What the baseline's worker's reference series (``drift.Sentinels``) says of the baseline trial's reading: its
    first reading where its sentinels contradicted it, and ``host busy: ...`` while every reading that stands for it
    (its launches and its sentinels, the contradicted first one left out) ran on a busy host. Why the second: with no
    quiet reading to replace it, a busy one still divides every speedup, and the report's header must say so rather
    than show it as the target's rate (beside a CPU hog, a first reading of 59.9 tokens/s was contradicted by three
    re-measures at 1.3, every one of them busy)."""
    base = next((r for r in records if r.role == "baseline" and r.complete), None)
    if base is None:
        return None, ""
    sentinels = Sentinels(records, noise_cv)
    disturbed = sentinels.disturbed_baseline(base.worker)
    return disturbed, sentinels.busy_reference(base.worker)


def disturbed_baseline(records: list[TrialRecord], noise_cv: float) -> DisturbedBaseline | None:
    """The baseline trial's first reading where its worker's sentinels contradicted it (``baseline_readings``)."""
    return baseline_readings(records, noise_cv)[0]


def launch_spread(records: list[TrialRecord]) -> float:
    """The launch-to-launch spread the study's reference runs allow (the prior until three exist); it comes
    from the reference runs alone (noise_cv only flags drift, so it is not needed here)."""
    return Sentinels(records, noise_cv=0.0).launch_spread()


def break_even(
    curves: pd.DataFrame, spread: float = PRIOR_LAUNCH_SIGMA, races: dict[int, RaceResult] | None = None
) -> str:
    """Where speculation stops paying on this host: the fewest users at which the best speculative
    configuration is not shown to serve more tokens/s in all than the best without speculation.

    With the load classes' races (``races``, ``tuner.decisions.load_race``), from their paired launch rounds and
    intervals. Without, each side is the best recorded trial, one launch each, so a ratio is told apart from 1
    only beyond 1.96 * sqrt(2) * ``spread`` in log terms (the study's launch spread, drift.Sentinels); a level
    inside that band says so instead of naming a break-even the next launch could move."""
    if races:
        return load_race.break_even(races)
    if curves.empty or "none" not in set(curves["family"]) or set(curves["family"]) == {"none"}:
        return "no break-even figure: the study measured no concurrency level with and without speculation"
    band = 1.96 * math.sqrt(2) * spread
    lines = []
    for users, level in curves.groupby("users"):
        plain = level.loc[level["family"] == "none", "aggregate_tokens_per_second"]
        spec = level[level["family"] != "none"]
        if plain.empty or spec.empty:
            continue
        best = spec.loc[spec["aggregate_tokens_per_second"].idxmax()]
        lines.append((int(users), best["aggregate_tokens_per_second"] / plain.iloc[0], best["family"]))
    detail = "; ".join(f"{users_text(u)}: x{r:.2f} ({f})" for u, r, f in lines)
    how = (
        f"{detail}; best speculative over best without, aggregate tokens/s, best recorded trial of each, one "
        f"launch each: told apart from x1.00 beyond x{math.exp(-band):.2f}-x{math.exp(band):.2f}, 95% for two "
        f"launches at the study's launch spread of {spread:.0%}"
    )
    first = next(((u, r) for u, r, _ in lines if math.log(r) <= band), None)
    if first is None:
        return f"speculation pays at every measured level ({how})"
    users, ratio = first
    if math.log(ratio) < -band:
        return f"speculation stops paying at {users_text(users)} at once on this host ({how})"
    shown = [u for u, r, _ in lines if u < users]
    return (
        f"speculation is shown to pay {f'up to {users_text(max(shown))}' if shown else 'at no measured level'}; "
        f"at {users_text(users)} at once it is within the launch spread of no speculation, so where it stops "
        f"paying is not shown by one launch of each ({how})"
    )


def effect(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Complete trials grouped by ``by``: best and median tokens/s, mean acceptance and quality."""
    pool = complete(frame).dropna(subset=by)
    if pool.empty:
        return pd.DataFrame(
            columns=[
                *by,
                "best_tokens_per_second",
                "median_tokens_per_second",
                "acceptance",
                "quality",
                "trials",
            ]
        )
    return pool.groupby(by, as_index=False).agg(
        best_tokens_per_second=("tokens_per_second", "max"),
        median_tokens_per_second=("tokens_per_second", "median"),
        acceptance=("acceptance", "mean"),
        quality=("quality", "mean"),
        trials=("trial", "count"),
    )


VARIANT_COLUMNS = [
    "target_quant",
    "family",
    "best_tokens_per_second",
    "speedup",
    "mean_kld",
    "same_top",
    "feasible",
]


def variant_front(frame: pd.DataFrame) -> pd.DataFrame:
    """A study of target variants: per variant and speculation family, the fastest complete trial, the variant's
    distance from the source (mean KLD, same top token; the source's own is 0 and 1) and whether it is within the
    study's quality bounds. Empty for a study without variants."""
    pool = complete(frame).dropna(subset=["target_quant"])
    if pool.empty or pool["target_quant"].nunique() < 2:
        return pd.DataFrame(columns=VARIANT_COLUMNS)
    rows = []
    for (variant, family), group in pool.groupby(["target_quant", "family"], sort=False):
        best = group.loc[group["tokens_per_second"].idxmax()]
        rows.append(
            {
                "target_quant": variant,
                "family": family,
                "best_tokens_per_second": best["tokens_per_second"],
                "speedup": best.get("speedup"),
                # the source's own trials carry 0 and 1 (kld scorer); NaN only where a column is absent
                "mean_kld": _figure_or(best.get("score_mean_kld"), 0.0),
                "same_top": _figure_or(best.get("score_same_top"), 1.0),
                "feasible": bool(best["feasible"]),
            }
        )
    return pd.DataFrame(rows, columns=VARIANT_COLUMNS)


def _figure_or(value: Any, default: float) -> float:
    return default if value is None or pd.isna(value) else float(value)


def importances(study: optuna.Study, record: StudyRecord) -> pd.DataFrame:
    """Parameter importance per objective (Optuna's default evaluator); empty when too few trials."""
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    rows = []
    if len(done) < 3:
        return pd.DataFrame(columns=["objective", "param", "importance"])
    for index, (objective, direction) in enumerate(zip(record.objectives, study.directions)):
        if len({t.values[index] for t in done}) < 2:
            continue  # a constant objective has no importances
        sign = -1.0 if direction == optuna.study.StudyDirection.MAXIMIZE else 1.0  # the evaluator minimizes

        def signed_value(trial: optuna.trial.FrozenTrial, index: int = index, sign: float = sign) -> float:
            return sign * trial.values[index]

        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*importances of params to achieve low")
                warnings.filterwarnings("ignore", message=".*have less than 2 trials")  # small studies
                result = optuna.importance.get_param_importances(study, target=signed_value)
        except (ValueError, RuntimeError):
            continue  # e.g. no parameter varied across complete trials
        rows += [{"objective": objective, "param": p, "importance": v} for p, v in result.items()]
    return pd.DataFrame(rows, columns=["objective", "param", "importance"])


def failures(frame: pd.DataFrame) -> pd.DataFrame:
    failed = frame[frame["state"] == "FAIL"]
    return failed[["trial", "method", "draft_max", "threads", "failure_reason", "failure_detail"]]


# ------------------------------------------------------------------ the whole report


@dataclass(frozen=True)
class ReportData:
    """Everything the HTML report shows, computed from storage alone."""

    study_name: str
    record: StudyRecord
    baseline_tokens_per_second: float | None
    bandwidth: Bandwidth | None
    roofline: Roofline | None
    trials: pd.DataFrame
    pareto: pd.DataFrame
    front_quality: pd.DataFrame
    front_acceptance: pd.DataFrame
    k_by_method: pd.DataFrame
    k_by_suite: pd.DataFrame
    best_per_suite: pd.DataFrame
    temperature: pd.DataFrame
    experts: pd.DataFrame
    variants: pd.DataFrame  # the target's quantization: speed against KL divergence by variant and family
    threads_numa: pd.DataFrame
    importances: pd.DataFrame
    failures: pd.DataFrame
    sentinels: pd.DataFrame  # baseline and sentinel trials: time, tokens/s, worker
    race: RaceResult | None
    acceptance_model: pd.DataFrame  # the structured sampler's fitted model against measured points
    # the drafts the probes left out, and why (``structured_sampler.unprobed``)
    unprobed: list[str] = field(default_factory=list)
    per_type: PerTypeResult | None = None  # the last per-type race (tuner export --per-type)
    families: pd.DataFrame | None = None  # per content type: best draft-only, lookup-only and stacked trial
    concurrency: pd.DataFrame | None = (
        None  # per family and level: the best aggregate tokens/s (by_concurrency)
    )
    prior: WarmStartPrior | None = None  # the warm start from an earlier study (tuner.search.prior)
    launch_spread: float = PRIOR_LAUNCH_SIGMA  # the study's launch-to-launch spread (drift.Sentinels)
    turns: pd.DataFrame | None = None  # conversations: each family's best by turn (output.turns)
    load_races: dict[int, RaceResult] | None = None  # each load class's last race (tuner export), by users
    bandwidth_curve: BandwidthCurve | None = None  # copy bandwidth by threads when the study started
    verifications: list[dict] | None = None  # every `tuner verify` of a deployed section, oldest first
    disturbed_baseline: DisturbedBaseline | None = None  # the first reading its sentinels contradicted
    reference_trial: int | None = None  # the trial whose reading the baseline rate is, when it is one trial's
    baseline_busy: str = ""  # ``host busy: ...`` while every baseline reading was busy (baseline_readings)

    @property
    def objectives(self) -> list[str]:
        return list(self.record.objectives)

    @property
    def floor(self) -> float | None:
        return self.record.floor


def report_data(study: optuna.Study, record: StudyRecord, bandwidth: Bandwidth | None = None) -> ReportData:
    """Compute the report's data; ``bandwidth`` defaults to the study's (or a probe now)."""
    bandwidth = bandwidth or study_bandwidth(record)
    roofline = study_roofline(record, bandwidth)
    records = store.read_trials(study)
    frame = trials_frame(records, roofline, record.measurement.get("noise_cv", 0.10))
    race = store.read_race(study)
    reference = store.read_reference(study)
    disturbed, baseline_busy = baseline_readings(records, record.measurement.get("noise_cv", 0.10))
    return ReportData(
        study_name=study.study_name,
        record=record,
        baseline_tokens_per_second=(
            disturbed.remeasured if disturbed else reference.tokens_per_second if reference else None
        ),
        disturbed_baseline=disturbed,
        reference_trial=reference.trial if reference and not disturbed else None,
        baseline_busy=baseline_busy,
        bandwidth=bandwidth,
        roofline=roofline,
        trials=frame,
        pareto=pareto_front(study, record, frame),
        front_quality=front_2d(frame, "quality"),
        front_acceptance=front_2d(frame, "acceptance"),
        k_by_method=k_by_method(frame),
        k_by_suite=k_by_suite(frame),
        best_per_suite=best_per_suite(frame),
        temperature=effect(frame, ["temperature", "method"]),
        experts=effect(frame, ["experts"]),
        variants=variant_front(frame),
        threads_numa=effect(frame, ["numa", "threads"]),
        importances=importances(study, record),
        failures=failures(frame),
        sentinels=sentinel_frame(records),
        race=RaceResult.from_json(race) if race else None,  # None: stored by an older version
        acceptance_model=pd.DataFrame(fitted_models(study)),
        unprobed=unprobed(study),
        per_type=PerTypeResult.from_json(per_type) if (per_type := store.read_per_type(study)) else None,
        prior=store.read_prior(study),
        families=families_by_suite(frame, records),
        concurrency=by_concurrency(frame),
        launch_spread=launch_spread(records),
        turns=speedup_by_turn(records, frame),
        load_races=load_race.read_races(study),
        bandwidth_curve=curve_of(record.fingerprint),
        verifications=store.read_verifications(study),
    )


def per_type_frame(result: PerTypeResult) -> pd.DataFrame:
    """One row per content type of a per-type race: its winner, K, tuning and held-out figures, gain."""
    rows = [
        {
            "suite": t.suite,
            "trial": t.winner,
            "method": method_of(t.config),
            "K": (t.config.get("draft_max") or 0) if t.config.get("spec_type", "none") != "none" else 0,
            "tuning_tokens_per_second": t.tuning_tokens_per_second,
            "held_out_tokens_per_second": t.held_out_tokens_per_second,
            "pooled_held_out_tokens_per_second": t.pooled_held_out_tokens_per_second,
            "baseline_held_out_tokens_per_second": t.baseline_held_out_tokens_per_second,
            "gain": t.gain,
            "interval": f"{t.gain_low:.2f}-{t.gain_high:.2f}",
            "entry": "own entry" if t.pays else "pooled winner",
            "why": t.why,
        }
        for t in result.types
    ]
    return pd.DataFrame(rows)


def sentinel_frame(records: list[TrialRecord]) -> pd.DataFrame:
    """The reference configuration's tokens/s over time, per worker: the drift the study saw."""
    rows = [
        {
            "trial": r.number,
            "role": r.role,
            "worker": r.worker,
            "at": pd.Timestamp(midpoint(r), unit="s"),
            "tokens_per_second": r.metrics.tokens_per_second,
            "cv": r.spread.cv if r.spread else None,
        }
        for r in records
        # ``complete`` already implies metrics; the check states it for the type checker
        if r.role in REFERENCE_ROLES and r.complete and r.metrics is not None and midpoint(r) is not None
    ]
    return pd.DataFrame(rows, columns=["trial", "role", "worker", "at", "tokens_per_second", "cv"])
