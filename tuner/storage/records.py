"""The typed records a study stores: one ``TrialRecord`` per trial, one ``StudyRecord`` per study.

Why: report, export, compare, dashboard, the sampler and the benchmarks all read what a
study measured. They read these records (through ``tuner.storage.store``, which owns how they
sit in Optuna's storage), never attribute strings, so a field has one name, one type
and one meaning everywhere.

A ``StudyRecord`` also says what makes two sets of numbers comparable
(``comparability``): the machine and build, the models, the space, the workload's
texts, the measurement settings and the scorer. A resumed study, an export's
re-measure and ``tuner compare`` check it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypedDict

from tuner.knobs.config import TrialConfig
from tuner.knobs.registry import remembers_requests
from tuner.machine.fingerprint import COMPARABILITY_KEYS, Fingerprint
from tuner.measurement.launch import ServerCommand
from tuner.measurement.load import LOAD_METRICS
from tuner.measurement.measured_launch import REMEMBERING_LOOKUP_RULE
from tuner.measurement.quality import ScorerFigures

SCHEMA_VERSION = 2  # 1: loose user attrs per field (before records); 2: one record per trial and study

ROLES = (
    "baseline",
    "warm_start",
    "search",
    "sentinel",
)  # sentinel: the baseline re-measured (tuner.decisions.drift)

# ModelInfo fields that identify a model without its path (compare, resume).
MODEL_IDENTITY_KEYS = (
    "architecture",
    "name",
    "file_size_bytes",
    "parameter_count",
    "file_type",
    "vocab_type",
    "vocab_size",
    "expert_count",
    "expert_used_count",
)


class SearchNote(TypedDict, total=False):
    """Why the structured sampler chose a trial, as its record keeps it: set together, or empty when the
    sampler left no note (an enqueued baseline, another sampler)."""

    stage: str  # the planner's stage (tuner.search.stages), e.g. "hardware", "refinement"
    reason: str | None


class WarmStartPrior(TypedDict, total=False):
    """What an earlier study in the same storage found on this host (``tuner.search.prior`` builds it, the
    study stores it once at creation). A found prior sets every key; a search without one holds it empty."""

    study: str  # the earlier study's name
    trial: int  # its winner's number
    tokens_per_second: float  # its winner's rate
    same_target: bool
    same_workload: bool
    hardware: dict[str, Any]  # its numa, numa_node and threads the new space admits (may be empty)
    # its whole winner, when the new space admits all of it (same workload only)
    params: dict[str, Any] | None


def digest(value: Any) -> str:
    """A short stable hash of JSON-able data."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Metrics:
    """A complete trial's figures; speedup is against the study's baseline tokens/s."""

    tokens_per_second: float  # median over repetitions of each repetition's pooled rate
    acceptance: float  # accepted / drafted draft tokens, 0.0 without speculation
    quality: float  # the study's scorer, 1.0 = the reference
    speedup: float

    def objective(self, name: str) -> float:
        return float(getattr(self, name))


@dataclass(frozen=True)
class Spread:
    """How far the repetitions of a trial disagree: cv of per-repetition rates.

    With fewer than two repetitions the spread is unknown (``cv`` None), never "not noisy".
    """

    repetitions: int
    cv: float | None
    noisy: bool | None  # cv above the study's noise_cv; None when unknown


@dataclass(frozen=True)
class Failure:
    reason: str  # a tuner.measurement.failures.FailureReason value, or "orphaned" for a dead process's trial
    detail: str


@dataclass(frozen=True)
class TrialRecord:
    """Everything one trial measured or why it could not, written once when it ends."""

    number: int
    state: str  # Optuna's state name: COMPLETE, FAIL, PRUNED, RUNNING, WAITING
    role: str  # one of ROLES
    config: TrialConfig
    command: ServerCommand | None = None  # what was launched (the runner adds --host/--port)
    metrics: Metrics | None = None
    spread: Spread | None = None
    drafted: int = 0
    accepted: int = 0
    per_suite_tokens_per_second: dict[str, float] = field(default_factory=dict)
    # conversations only: turn number (as a string: JSON keys) -> median over repetitions of that turn's pooled rate
    per_turn_tokens_per_second: dict[str, float] = field(default_factory=dict)
    samples: tuple[
        dict, ...
    ] = ()  # one per measured request (tuner.measurement.measure.Sample without text/tokens)
    outputs: dict[str, str] = field(default_factory=dict)  # prompt id -> text of the first repetition
    constraint: float | None = None  # quality floor - quality: feasible when <= 0
    failure: Failure | None = None
    pruned: str | None = None  # why the trial was stopped early (state PRUNED; its figures are partial)
    search: SearchNote = field(default_factory=SearchNote)  # the sampler's stage and reason for choosing it
    worker: str = ""
    log_tail: str = ""
    duration_s: float | None = None
    started_at: float | None = None  # seconds since the epoch: sentinels are interpolated in time
    ended_at: float | None = None
    host: dict = field(
        default_factory=dict
    )  # host state during the trial (tuner.machine.host.trial_host_state)
    scores: ScorerFigures = field(default_factory=ScorerFigures)  # figures besides quality, e.g. kld's
    load: tuple[dict, ...] = ()  # per concurrency level: tuner.measurement.load.Level.summary()
    constraints: dict = field(default_factory=dict)  # with load bounds: each named constraint (<= 0 feasible)

    def objective(self, name: str) -> float:
        """An objective's value: a metric, or a load metric at its level (``p95_ttft_ms_c4``)."""
        if "_c" in name and name.rsplit("_c", 1)[1].isdigit():
            metric, users = name.rsplit("_c", 1)
            figure = self.level_figure(metric, int(users))
            if figure is None:
                raise KeyError(f"trial {self.number} measured no level of {users} users")
            return figure
        assert self.metrics is not None
        return self.metrics.objective(name)

    def level_figure(self, metric: str, users: int) -> float | None:
        """A load metric at one level (``aggregate_tokens_per_second`` at 2 users); None when not measured."""
        level = next((lv for lv in self.load if lv["users"] == users), None)
        return None if level is None else float(level[metric])

    def load_figures(self) -> dict[str, float]:
        """Every load metric at every level, by stored name: the report's and the frame's columns."""
        return {f"{metric}_c{lv['users']}": lv[metric] for lv in self.load for metric in LOAD_METRICS}

    @property
    def argv(self) -> list[str]:
        return self.command.argv if self.command else []

    @property
    def complete(self) -> bool:
        return self.state == "COMPLETE" and self.metrics is not None

    @property
    def measured_metrics(self) -> Metrics:
        """The metrics of a trial known to have them (``complete``, or pruned with its partial figures)."""
        if self.metrics is None:
            raise ValueError(f"trial {self.number} ({self.state}) has no metrics")
        return self.metrics

    @property
    def feasible(self) -> bool:
        return self.complete and self.constraint is not None and self.constraint <= 0

    def to_json(self) -> dict:
        data = asdict(self)
        data["config"] = self.config.as_dict()
        data["command"] = self.command.to_json() if self.command else None
        data["samples"] = list(self.samples)
        return data

    @classmethod
    def from_json(cls, data: dict, number: int, state: str) -> TrialRecord:
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        return cls(
            **{
                **data,
                "number": number,
                "state": state,
                "config": config_from_dict(data.get("config") or {}),
                "command": ServerCommand.from_json(data["command"]) if data.get("command") else None,
                "metrics": Metrics(**data["metrics"]) if data.get("metrics") else None,
                "spread": Spread(**data["spread"]) if data.get("spread") else None,
                "samples": tuple(data.get("samples") or ()),
                "load": tuple(data.get("load") or ()),
                "failure": Failure(**data["failure"]) if data.get("failure") else None,
            }
        )


def config_from_dict(data: dict) -> TrialConfig:
    known = {f.name for f in fields(TrialConfig)}
    return TrialConfig(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Reference:
    """The baseline's outputs (the agreement scorer's reference) and its tokens/s."""

    trial: int
    tokens: dict[str, list[int]]
    texts: dict[str, str]
    tokens_per_second: float


@dataclass(frozen=True)
class StudyRecord:
    """What a study was measured with, written once when it is created."""

    name: str
    created_by: str
    fingerprint: Fingerprint  # machine and build
    build: dict  # the llama.cpp build manifest
    target: dict  # tuner.models.gguf_info.ModelInfo.to_dict()
    drafts: dict[str, dict]
    space: dict  # ResolvedSpace.as_dict()
    space_digest: str
    space_notes: tuple[str, ...]
    objectives: tuple[str, ...]
    quality: dict  # {"scorer": ..., "floor": ...}
    spec_path: str
    workload: dict  # {"prompts": [ids], "digest": hash of suites, ids and texts[, "concurrency": levels, "constraints"]}
    measurement: dict  # MeasurementSettings as a dict, plus ctx_size
    schema: int = SCHEMA_VERSION
    # draft name -> provenance of a llama-quantize variant: source, source_sha256, type, command
    quantized_drafts: dict = field(default_factory=dict)
    # target_quant value -> a llama-quantize variant of the target: provenance, path, sha256, bytes
    target_variants: dict = field(default_factory=dict)

    @property
    def floor(self) -> float | None:
        return self.quality.get("floor")

    def comparability(self) -> dict[str, Any]:
        """The fields that must match for two measurements to be compared, by name."""
        return {
            **{key: self.fingerprint.get(key) for key in COMPARABILITY_KEYS},
            "target model": model_identity(self.target),
            "drafts": {name: model_identity(d) for name, d in sorted(self.drafts.items())},
            "search space": self.space_digest,
            "objectives": list(self.objectives),
            "workload (prompt texts)": self.workload.get("digest"),
            "workload.concurrency": self.workload.get("concurrency", [1]),
            "constraints": self.workload.get("constraints", {}),
            **{f"measurement.{k}": v for k, v in sorted(self.measurement.items()) if k != REMEMBERING_LOOKUP},
            # None in a study stored before the rule, or whose space holds no lookup that remembers
            "measurement of a lookup that remembers": self.measurement.get(REMEMBERING_LOOKUP),
            "quality.scorer": self.quality.get("scorer"),
            "quality.floor": self.quality.get("floor"),
            "quality.max_kld": self.quality.get("max_kld"),  # kld scorer; None for the others and old records
            "quality.text": self.quality.get("text_digest"),  # the text perplexity and kld score on
            "quantized drafts": {
                name: [q.get("source_sha256"), q.get("type")]
                for name, q in sorted(self.quantized_drafts.items())
            },
            "target variants": {
                name: [q.get("source_sha256"), q.get("type")]
                for name, q in sorted(self.target_variants.items())
            },
        }

    def to_json(self) -> dict:
        data = asdict(self)
        data["space_notes"] = list(self.space_notes)
        data["objectives"] = list(self.objectives)
        return data

    @classmethod
    def from_json(cls, data: dict) -> StudyRecord:
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        return cls(
            **{
                **data,
                "space_notes": tuple(data.get("space_notes") or ()),
                "objectives": tuple(data.get("objectives") or ()),
            }
        )


# the measurement record's key: how a lookup that remembers requests is measured
REMEMBERING_LOOKUP = "remembering_lookup"


def measurement_record(settings: dict, spec_values: list[str]) -> dict:
    """The measurement settings as a study stores them (``settings``: ``MeasurementSettings.comparability``) and,
    when the space's speculation (``spec_values``: its spec_type and lookup values) holds a lookup that remembers
    requests, how such a lookup is measured (``measured_launch.REMEMBERING_LOOKUP_RULE``)."""
    if not remembers_requests(spec_values):
        return settings
    return {**settings, REMEMBERING_LOOKUP: REMEMBERING_LOOKUP_RULE}


def model_identity(info: dict) -> dict:
    """A model as content, not as a path: the same file copied elsewhere is the same model."""
    return {key: info.get(key) for key in MODEL_IDENTITY_KEYS}


def changes(
    stored: StudyRecord,
    current: StudyRecord,
    ignore: tuple[str, ...] = (),
    sides: tuple[str, str] = ("the study has", "this run has"),
) -> list[str]:
    """What differs between two studies' comparability, one phrase per field; a field that is a
    mapping (a model's identity, the drafts) names the entry inside it that differs."""
    before, now = stored.comparability(), current.comparability()
    return [
        line
        for key in before
        if key not in ignore
        for line in _differences(key, before[key], now.get(key), sides)
    ]


_ABSENT = object()


def _differences(label: str, old: Any, new: Any, sides: tuple[str, str]) -> list[str]:
    if old == new:
        return []
    if old is _ABSENT or new is _ABSENT:  # e.g. a draft only one side has
        return [
            f"{label} differs ({sides[0]} {'none' if old is _ABSENT else 'it'}, "
            f"{sides[1]} {'none' if new is _ABSENT else 'it'})"
        ]
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            line
            for key in [*old, *(k for k in new if k not in old)]
            for line in _differences(f"{label} {key}", old.get(key, _ABSENT), new.get(key, _ABSENT), sides)
        ]
    return [f"{label} differs ({sides[0]} {_short(old)}, {sides[1]} {_short(new)})"]


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
