"""The study's trials as the structured search reads them: one ``PastTrial`` per stored trial.

Why: every stage of the structured search (``tuner.search.planner``) plans from what the study has
measured, and reads it the same way: the figure maximised (the study's first objective, a minimised
one inverted), the acceptance, the quality constraint, the failure reason a permanent failure
blames, the per-suite rates a stack is judged on. A running trial is read at its plan (the
``search:plan`` system attr another worker wrote), so two workers never plan the same trial.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.machine.host import host_was_busy
from tuner.measurement.failures import PERMANENT
from tuner.measurement.load import split_metric_name
from tuner.measurement.measure import pooled_from_rates, prompt_rate
from tuner.storage import store
from tuner.storage.records import TrialRecord

PLAN_ATTR = "search:plan"  # a system attr: the running trial's planned configuration, for other workers
PERMANENT_REASONS = frozenset(r.value for r in PERMANENT)  # a failure for one of these blames the option
STATES = {
    TrialState.COMPLETE: "complete",
    TrialState.PRUNED: "pruned",
    TrialState.FAIL: "failed",
    TrialState.RUNNING: "running",
}


@dataclass(frozen=True)
class PastTrial:
    """One stored trial as the planner sees it."""

    params: dict[str, Any]
    state: str  # complete, pruned, failed, running
    value: float | None  # the figure maximised: the first objective (tokens/s per request, aggregate, ...)
    acceptance: float | None
    feasible: bool
    failure: str | None
    role: str
    suites: dict[str, float] = field(default_factory=dict)  # tokens/s per suite (content type), pooled
    prompt_rate: float | None = None  # prompt tokens/s over its requests (measure.prompt_rate)
    # the figure's relative standard error within its launch (``within_error``)
    within_error: float | None = None
    drafted: int | None = None  # draft tokens over its requests (llama.cpp's draft_n); None: not recorded
    steps: int | None = None  # the target's decode steps after each request's first token (``decode_steps``)
    busy: bool = False  # measured while other processes took CPU (``machine.host.host_was_busy``)

    @property
    def measured(self) -> bool:
        return self.state in ("complete", "pruned") and self.value is not None

    @property
    def measured_value(self) -> float:
        """The value of a trial known to be ``measured``: the stages compare only measured trials."""
        if self.value is None:
            raise ValueError(f"a {self.state} trial without a measured value was compared")
        return self.value

    @property
    def blamed(self) -> bool:
        """Failed for a permanent reason: its option is dropped."""
        return self.state == "failed" and self.failure in PERMANENT_REASONS


def read_history(study: optuna.Study) -> list[PastTrial]:
    """The stored trials, with what each measured (pruned ones: what they measured before stopping); the
    value maximised is the study's first objective (a minimised one inverted)."""
    context = store.search_context(study)
    objective = context[1][0] if context and context[1] else "tokens_per_second"
    minimise = study.directions[0] == optuna.study.StudyDirection.MINIMIZE
    trials = []
    for stored in study.get_trials(deepcopy=False):
        state = STATES.get(stored.state)
        if state is None:
            continue
        params = dict(stored.params)
        if state == "running":
            planned = stored.system_attrs.get(PLAN_ATTR)
            params = json.loads(planned) if planned else params
        record = store.read_trial(stored)
        metrics = record.metrics
        feasible = all(v <= 0 for v in (stored.constraints or {}).values())
        trials.append(
            PastTrial(
                params,
                state,
                objective_value(record, objective, minimise),
                metrics.acceptance if metrics else None,
                feasible,
                record.failure.reason if record.failure else None,
                record.role,
                suite_rates(record.samples),
                prompt_rate(record.samples),
                within_error(record),
                *draft_counts(record.samples),
                busy=bool(record.host and host_was_busy(record.host)),
            )
        )
    return trials


def draft_counts(samples: Sequence[dict]) -> tuple[int | None, int | None]:
    """(drafted, steps) over a trial's requests: the draft tokens llama.cpp reported and the target's decode
    steps after each request's first token (each yields one token of its own besides the drafts it accepted:
    ``predicted_n - 1 - draft_n_accepted``); (None, None) where the samples do not carry them (a replay's)."""
    keys = ("predicted_n", "draft_n", "draft_n_accepted")
    if not samples or not all(all(s.get(k) is not None for k in keys) for s in samples):
        return None, None
    drafted = sum(int(s["draft_n"]) for s in samples)
    steps = sum(max(int(s["predicted_n"]) - 1 - int(s["draft_n_accepted"]), 0) for s in samples)
    return drafted, steps


def within_error(record: TrialRecord) -> float | None:
    """How far a trial's figure could move by its own passes' disagreement: the cv of its per-pass rates over the
    square root of the passes (a standard error of their mean). It misses what a whole launch shares (placement,
    clocks), so it bounds a trial's noise from below; None with fewer than two passes."""
    spread = record.spread
    if spread is None or spread.cv is None or spread.repetitions < 2:
        return None
    return spread.cv / math.sqrt(spread.repetitions)


def objective_value(record, objective: str, minimise: bool) -> float | None:
    """A trial's figure to maximise; None where it has none (a pruned trial never reached the load levels)."""
    if record.metrics is None:
        return None
    try:
        figure = record.objective(objective)
    except KeyError:
        return None
    return (1.0 / figure if figure > 0 else None) if minimise else figure


def objective_level(objectives: Sequence[str]) -> int | None:
    """The users the first objective measures at (``p95_ttft_ms_c4``: 4), if it is a load metric."""
    split = split_metric_name(objectives[0]) if objectives else None
    return split[1] if split else None


def suite_rates(samples: Sequence[dict]) -> dict[str, float]:
    """Tokens/s per suite over a trial's requests, pooled; from the requests, so a pruned trial (and a
    simulated replay's) has them too."""
    suites = {s["suite"] for s in samples if s.get("suite") and s.get("tokens_per_second")}
    return {
        suite: pooled_from_rates(s for s in samples if s.get("suite") == suite) for suite in sorted(suites)
    }
