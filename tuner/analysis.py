"""A study's trials as pandas frames, fronts, effects, roofline: the data of reports and exports.

Everything here returns data; ``tuner.report_html`` turns it into one self-contained
HTML page and ``tuner.report`` is the command. Keeping the two apart lets tests assert on numbers, and lets export and
compare reuse the same frame (one row per trial, knobs from the stored ``config``,
objectives from ``metrics``).

The roofline is what operators reason with: decode without speculation streams the
weights once per token, so it cannot beat memory bandwidth / bytes read per token (for
MoE: the shared weights plus the active experts' share). Each trial's tokens/s is shown
as a fraction of that ceiling; speculation is how a trial gets above 1.
"""

from __future__ import annotations

import shlex
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna
import pandas as pd

from tuner.errors import UserError
from tuner.host import measure_memory_bandwidth
from tuner.topology import read_topology
from tuner.spec import default_storage_url
from tuner.validate import load_yaml_mapping

KNOBS = ("spec_type", "draft", "draft_max", "draft_min", "draft_p_min", "temperature", "experts", "numa",
         "numa_node", "threads", "threads_batch")
INT_KNOBS = ("draft_max", "draft_min", "experts", "numa_node", "threads", "threads_batch")
METRICS = ("tokens_per_second", "acceptance", "quality", "speedup")
DEFAULT_OBJECTIVES = ["tokens_per_second", "acceptance", "quality"]
COLUMNS = ("trial", "state", "role", "feasible", "method", *KNOBS, *METRICS, "cv", "noisy", "drafted", "accepted",
           "constraint_quality", "failure_reason", "failure_detail", "duration_s", "command",
           "roofline_tokens_per_second", "roofline_fraction")


# ------------------------------------------------------------------ opening a study


def resolve_ref(ref: str, storage: str | None) -> tuple[str, str]:
    """(study name, storage URL) from a study name or a study file (its name and storage)."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        data = load_yaml_mapping(path)
        name = data.get("name") or path.stem
        return str(name), storage or data.get("storage") or default_storage_url()
    return ref, storage or default_storage_url()


def require_storage(url: str) -> None:
    """A missing SQLite file is a typo or a study never run, not a new empty database."""
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise UserError(f"storage {url}: no such file; run a study first (`tuner run studies/NAME.yaml`) or pass --storage")


def open_study(ref: str, storage: str | None = None) -> optuna.Study:
    """Load a stored study by name or study file; an unknown name lists the known ones."""
    name, url = resolve_ref(ref, storage)
    require_storage(url)
    try:
        return optuna.load_study(study_name=name, storage=url, sampler=optuna.samplers.RandomSampler(seed=0))
    except KeyError:
        known = optuna.get_all_study_names(url)
        raise UserError(
            f"study {name!r}: not in {url}; known studies: {', '.join(known) or 'none'}"
        ) from None


def strip_host_port(argv: list[str]) -> list[str]:
    """A stored argv without the runner's --host/--port (they were the trial's, not yours)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--host", "--port"):
            skip = True
        else:
            out.append(arg)
    return out


def objectives_of(study: optuna.Study) -> list[str]:
    return list(study.user_attrs.get("objectives") or DEFAULT_OBJECTIVES)


def quality_floor(study: optuna.Study) -> float | None:
    return (study.user_attrs.get("quality") or {}).get("floor")


# ------------------------------------------------------------------ roofline


@dataclass(frozen=True)
class Bandwidth:
    """Memory bandwidth for the roofline, and where the figure came from."""

    bytes_per_s: float
    source: str  # "fingerprint" or "measured at report time"
    note: str


def study_bandwidth(study: optuna.Study, probe: Callable[[], float] | None = None) -> Bandwidth:
    """The fingerprint's bandwidth; without one, measured now (and the report says so)."""
    fp = study.user_attrs.get("fingerprint") or {}
    if fp.get("bandwidth_bytes_per_s"):
        return Bandwidth(float(fp["bandwidth_bytes_per_s"]), "fingerprint",
                         "measured when the study started (copy probe, a lower bound)")
    measured = (probe or measure_memory_bandwidth)()
    here = read_topology().cpu_model
    note = "the study's fingerprint has no bandwidth: measured at report time on this host (copy probe, a lower bound)"
    if fp.get("cpu_model") and fp["cpu_model"] != here:
        note += f"; this host's CPU ({here}) is not the study's ({fp['cpu_model']}), so the ceiling is indicative only"
    return Bandwidth(measured, "measured at report time", note)


def expert_weights_bytes(target: dict) -> int | None:
    """Bytes of the routed experts' tensors: from the study, else from the GGUF if it is here."""
    if target.get("expert_weights_bytes") is not None:
        return int(target["expert_weights_bytes"])
    path = Path(target.get("path") or "")
    if not path.is_file():
        return None
    from gguf import GGUFReader  # lazy: only MoE reports from older studies need it

    return sum(int(t.n_bytes) for t in GGUFReader(path).tensors if "_exps." in t.name)


@dataclass(frozen=True)
class Roofline:
    """Decode ceiling without speculation: bandwidth / bytes of weights read per token."""

    bandwidth: Bandwidth
    weights_bytes: int
    expert_bytes: int | None  # routed experts (MoE only)
    expert_count: int | None
    default_experts: int | None
    note: str

    def bytes_per_token(self, experts: int | None) -> float:
        if not self.expert_bytes or not self.expert_count:
            return float(self.weights_bytes)
        active = experts or self.default_experts or self.expert_count
        return self.weights_bytes - self.expert_bytes + self.expert_bytes * active / self.expert_count

    def tokens_per_second(self, experts: int | None = None) -> float:
        return self.bandwidth.bytes_per_s / self.bytes_per_token(experts)


def study_roofline(study: optuna.Study, bandwidth: Bandwidth) -> Roofline | None:
    """None when the study does not record the target's weight bytes."""
    target = study.user_attrs.get("target") or {}
    if not target.get("weights_bytes"):
        return None
    expert_bytes = expert_weights_bytes(target) if target.get("is_moe") else None
    note = "weights read per token = all tensor bytes of the target"
    if target.get("is_moe"):
        note = ("weights read per token = shared tensors + active/total of the routed experts"
                if expert_bytes else
                "MoE target whose expert tensor bytes are unknown (GGUF not here): all weights counted, ceiling too low")
    return Roofline(bandwidth, int(target["weights_bytes"]), expert_bytes or None, target.get("expert_count"),
                    target.get("expert_used_count"), note)


# ------------------------------------------------------------------ the trials frame


def method_of(config: dict) -> str:
    """How a trial drafts: the draft model's name, the n-gram type, or "none"."""
    spec = config.get("spec_type", "none")
    if spec == "draft-simple":
        return config.get("draft") or spec
    return spec


def trials_frame(study: optuna.Study, roofline: Roofline | None = None) -> pd.DataFrame:
    """One row per finished trial: knobs, objectives, key attrs, per-suite t/s, roofline share."""
    objectives = objectives_of(study)
    rows = []
    for t in study.get_trials(deepcopy=False):
        if not t.state.is_finished():
            continue
        a = t.user_attrs
        config = a.get("config") or dict(t.params)
        complete = t.state == optuna.trial.TrialState.COMPLETE
        metrics = a.get("metrics") or (dict(zip(objectives, t.values)) if complete and t.values else {})
        row = {
            "trial": t.number,
            "state": t.state.name,
            "role": a.get("role", "search"),
            "feasible": complete and a.get("constraint_quality", 1.0) <= 0,
            "method": method_of(config),
            **{k: config.get(k) for k in KNOBS},
            **{m: metrics.get(m) for m in METRICS},
            "cv": a.get("cv"),
            "noisy": a.get("noisy"),
            "drafted": a.get("drafted"),
            "accepted": a.get("accepted"),
            "constraint_quality": a.get("constraint_quality"),
            **{f"tps_{s}": v for s, v in (a.get("per_suite_tokens_per_second") or {}).items()},
            "failure_reason": a.get("failure_reason"),
            "failure_detail": a.get("failure_detail"),
            "duration_s": t.duration.total_seconds() if t.duration else None,
            "command": shlex.join(strip_host_port(a["argv"])) if a.get("argv") else None,
        }
        if roofline is not None and complete and metrics.get("tokens_per_second") is not None:
            ceiling = roofline.tokens_per_second(config.get("experts"))
            row["roofline_tokens_per_second"] = ceiling
            row["roofline_fraction"] = metrics["tokens_per_second"] / ceiling
        rows.append(row)
    frame = pd.DataFrame(rows)
    for column in COLUMNS:  # a study without (complete) trials still has every column
        if column not in frame:
            frame[column] = pd.Series(dtype=bool if column == "feasible" else float)
    for knob in INT_KNOBS:
        frame[knob] = frame[knob].astype("Int64")
    return frame


def suites_of(frame: pd.DataFrame) -> list[str]:
    return [c.removeprefix("tps_") for c in frame.columns if c.startswith("tps_")]


def complete(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["state"] == "COMPLETE"]


def feasible(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["feasible"].astype(bool)]


# ------------------------------------------------------------------ fronts


def pareto_mask(frame: pd.DataFrame, columns: list[str], maximize: list[bool] | None = None) -> pd.Series:
    """True for rows no other row dominates (at least as good everywhere, better somewhere)."""
    maximize = maximize or [True] * len(columns)
    signs = [1.0 if m else -1.0 for m in maximize]
    values = frame[columns].astype(float).to_numpy() * signs
    mask = []
    for i, row in enumerate(values):
        dominated = any((other >= row).all() and (other > row).any() for j, other in enumerate(values) if j != i)
        mask.append(not dominated)
    return pd.Series(mask, index=frame.index, dtype=bool)


def pareto_front(study: optuna.Study, frame: pd.DataFrame) -> pd.DataFrame:
    """The feasible trials no feasible trial beats on every objective, fastest first."""
    pool = feasible(frame)
    if pool.empty:
        return pool
    objectives = objectives_of(study)
    maximize = [d == optuna.study.StudyDirection.MAXIMIZE for d in study.directions]
    front = pool[pareto_mask(pool, objectives, maximize)]
    return front.sort_values("tokens_per_second", ascending=False)


def front_2d(frame: pd.DataFrame, x: str, y: str = "tokens_per_second") -> pd.DataFrame:
    """The feasible trials on the 2-D front of ``x`` against ``y`` (both maximized), by ``x``."""
    pool = feasible(frame).dropna(subset=[x, y])
    if pool.empty:
        return pool
    return pool[pareto_mask(pool, [x, y])].sort_values(x)


def knee(front: pd.DataFrame, x: str = "quality", y: str = "tokens_per_second") -> int | None:
    """The trial at the knee of a 2-D front: farthest from the chord joining its two ends.

    Both axes are scaled to [0, 1] over the front first; with fewer than three
    distinct points there is no bend and the fastest trial is the knee.
    """
    if front.empty:
        return None
    points = front[[x, y, "trial"]].drop_duplicates(subset=[x, y]).sort_values(x)
    if len(points) < 3:
        return int(front.sort_values(y, ascending=False)["trial"].iloc[0])
    xs = (points[x] - points[x].min()) / (points[x].max() - points[x].min())
    ys = (points[y] - points[y].min()) / (points[y].max() - points[y].min())
    (x0, y0), (x1, y1) = (xs.iloc[0], ys.iloc[0]), (xs.iloc[-1], ys.iloc[-1])
    distance = ((y1 - y0) * xs - (x1 - x0) * ys + x1 * y0 - y1 * x0).abs()
    return int(points["trial"].loc[distance.idxmax()])


# ------------------------------------------------------------------ effects


def k_by_method(frame: pd.DataFrame) -> pd.DataFrame:
    """Best feasible tokens/s per (drafting method, K); no speculation is K = 0."""
    pool = feasible(frame).assign(K=lambda f: f["draft_max"].fillna(0).astype(int))
    if pool.empty:
        return pd.DataFrame(columns=["method", "K", "tokens_per_second", "acceptance", "trials"])
    return (pool.groupby(["method", "K"], as_index=False)
            .agg(tokens_per_second=("tokens_per_second", "max"), acceptance=("acceptance", "mean"),
                 trials=("trial", "count")))


def per_suite_long(frame: pd.DataFrame) -> pd.DataFrame:
    """Feasible trials' per-content-type tokens/s, one row per (trial, suite)."""
    suites = suites_of(frame)
    pool = feasible(frame)
    if pool.empty or not suites:
        return pd.DataFrame(columns=["trial", "suite", "tokens_per_second"])
    keep = ["trial", "method", "spec_type", "draft", "draft_max", "temperature"]
    long = pool.melt(id_vars=keep, value_vars=[f"tps_{s}" for s in suites], var_name="suite",
                     value_name="suite_tokens_per_second").dropna(subset=["suite_tokens_per_second"])
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
    return best[["suite", "trial", "tokens_per_second", "method", "spec_type", "draft", "draft_max",
                 "temperature"]].reset_index(drop=True)


def effect(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Complete trials grouped by ``by``: best and median tokens/s, mean acceptance and quality."""
    pool = complete(frame).dropna(subset=by)
    if pool.empty:
        return pd.DataFrame(columns=[*by, "best_tokens_per_second", "median_tokens_per_second",
                                     "acceptance", "quality", "trials"])
    return (pool.groupby(by, as_index=False)
            .agg(best_tokens_per_second=("tokens_per_second", "max"),
                 median_tokens_per_second=("tokens_per_second", "median"),
                 acceptance=("acceptance", "mean"), quality=("quality", "mean"), trials=("trial", "count")))


def importances(study: optuna.Study) -> pd.DataFrame:
    """Parameter importance per objective (Optuna's default evaluator); empty when too few trials."""
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    rows = []
    if len(done) < 3:
        return pd.DataFrame(columns=["objective", "param", "importance"])
    for i, (objective, direction) in enumerate(zip(objectives_of(study), study.directions)):
        if len({t.values[i] for t in done}) < 2:
            continue  # a constant objective has no importances
        sign = -1.0 if direction == optuna.study.StudyDirection.MAXIMIZE else 1.0  # the evaluator minimizes
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*importances of params to achieve low")
                warnings.filterwarnings("ignore", message=".*have less than 2 trials")  # small studies
                result = optuna.importance.get_param_importances(
                    study, target=lambda t, i=i, sign=sign: sign * t.values[i])
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
    attrs: dict
    objectives: list[str]
    floor: float | None
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
    threads_numa: pd.DataFrame
    importances: pd.DataFrame
    failures: pd.DataFrame


def report_data(study: optuna.Study, bandwidth: Bandwidth | None = None) -> ReportData:
    """Compute the report's data; ``bandwidth`` defaults to the study's (or a probe now)."""
    bandwidth = bandwidth or study_bandwidth(study)
    roofline = study_roofline(study, bandwidth)
    frame = trials_frame(study, roofline)
    reference = study.user_attrs.get("reference") or {}
    return ReportData(
        study_name=study.study_name,
        attrs=dict(study.user_attrs),
        objectives=objectives_of(study),
        floor=quality_floor(study),
        baseline_tokens_per_second=reference.get("tokens_per_second"),
        bandwidth=bandwidth,
        roofline=roofline,
        trials=frame,
        pareto=pareto_front(study, frame),
        front_quality=front_2d(frame, "quality"),
        front_acceptance=front_2d(frame, "acceptance"),
        k_by_method=k_by_method(frame),
        k_by_suite=k_by_suite(frame),
        best_per_suite=best_per_suite(frame),
        temperature=effect(frame, ["temperature", "method"]),
        experts=effect(frame, ["experts"]),
        threads_numa=effect(frame, ["numa", "threads"]),
        importances=importances(study),
        failures=failures(frame),
    )
