"""The default ``structured`` sampler: Optuna's sampler interface around the stage planner.

The search itself, stage by stage, is ``tuner.search.planner`` (the order) and ``tuner.search.stages`` (one
module per stage); the trials it plans from are read by ``tuner.search.history``. When nothing is left to
plan, or the space lacks the expected shape, proposals come from the fallback, the project's
``NoRepeatSampler(TPE)``. The plan is a pure function of the stored trials (and the prior stored with the
study), so any worker, or a resumed study, computes the same next step; each planned trial records
``search_stage`` and ``search_reason`` user attrs ("predicted best K=24 for draft X from acceptance 0.83 ...")
for the study output and the dashboard, and its plan as a system attr (``PLAN_ATTR``) other workers read.

Lifecycle (Optuna's sampler interface): ``before_trial`` plans the whole configuration (enqueued trials,
such as the baseline, are left alone); ``sample_independent`` returns the planned value for each parameter
``tuner.search.space.suggest`` asks, so K and threads stay ``IntDistribution`` as in any study; the relative
methods and everything unplanned go to the fallback. A plan is completed by the real ``suggest``
(``SearchState.complete``), so it holds exactly the knobs a trial of it asks (no n-gram key without a lookup
in play).

``fitted_models``: for the report, each option's fitted speculation model against its measured points;
``unprobed``: the drafts the probes left out, and why.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.machine.bandwidth import PLANNER_SHARE, bandwidth_saturation
from tuner.search.history import PLAN_ATTR, objective_level, read_history
from tuner.search.planner import plan
from tuner.search.speedup_model import draft_byte_shares, measured_acceptance
from tuner.search.stages import probes
from tuner.search.stages.configs import KnobValues, option_name
from tuner.search.stages.state import SearchState
from tuner.storage import store


class StructuredSampler(optuna.samplers.BaseSampler):
    def __init__(self, fallback: optuna.samplers.BaseSampler, seed: int | None = None):
        self.fallback = fallback
        self.seed = seed
        self._plans: dict[int, dict | None] = {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.fallback.before_trial(study, trial)
        if "fixed_params" in trial.system_attrs:  # enqueued: the baseline or a warm start
            return
        proposal = None
        context = store.search_context(study)
        if context:
            proposal = plan(
                context[0],
                read_history(study),
                store.read_prior(study),
                objective_level(context[1]),
                bandwidth_saturation(store.host_fingerprint(study), PLANNER_SHARE),
                draft_byte_shares(*store.study_models(study)),
            )
        if proposal is None:
            self._plans[trial.number] = None
            self._note(study, trial, "refinement", "no structured step left: TPE proposes")
            return
        self._plans[trial.number] = proposal.params
        study._storage.set_trial_system_attr(trial._trial_id, PLAN_ATTR, json.dumps(proposal.params))
        self._note(study, trial, proposal.stage, proposal.reason)

    @staticmethod
    def _note(study: optuna.Study, trial: FrozenTrial, stage: str, reason: str) -> None:
        store.note_search(study, trial, stage, reason)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        if self._plans.get(trial.number) is not None:
            return {}
        return self.fallback.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if self._plans.get(trial.number) is not None or not search_space:
            return {}
        return self.fallback.sample_relative(study, trial, search_space)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        planned = self._plans.get(trial.number)
        if planned and param_name in planned:
            value = planned[param_name]
            try:
                if param_distribution._contains(param_distribution.to_internal_repr(value)):
                    return value
            except (ValueError, TypeError):
                pass
        return self.fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self._plans.pop(trial.number, None)
        self.fallback.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.fallback.reseed_rng()


def fitted_models(study: optuna.Study) -> list[dict]:
    """For the report: each option's fitted model against its measured points, at the baseline's
    temperature and experts (the points the sampler fitted). One row per measured point, with the
    model's acceptance and speedup at that K, and the predicted best K."""
    state = _finished_state(study)
    if state is None:
        return []
    start = state.start()
    rows = []
    for option in state.options():
        model = state.fit_option(option, start.temperature, start.experts)
        if model is None:
            continue
        best_k = model.best_k(state.k_values) if state.k_values else None
        for point in sorted(model.points, key=lambda p: p.k):
            rows.append(
                {
                    "option": option_name(option),
                    "k": point.k,
                    "acceptance": point.acceptance,
                    "model_acceptance": measured_acceptance(model.a_at(point.k), point.k),
                    "speedup": point.speedup,
                    "model_speedup": model.predict(point.k),
                    "a": model.a_at(point.k),
                    "cost_ratio": model.c,
                    "round_overhead": model.overhead,
                    "drafting_share": point.share,
                    "predicted_best_k": best_k,
                    "predicted_best_speedup": model.predict(best_k) if best_k else None,
                }
            )
    return rows


def unprobed(study: optuna.Study) -> list[str]:
    """For the report: one line per draft the probes left out because its weight bytes cap its speedup below
    one measured (``SearchState.beyond_reach``), as the study's trials read now."""
    state = _finished_state(study)
    return [] if state is None else probes.passed_over(state)


def _finished_state(study: optuna.Study) -> SearchState | None:
    """The search's state over every stored trial, as the report reads it; None before a baseline."""
    context = store.search_context(study)
    if not context:
        return None
    state = SearchState(
        KnobValues(context[0]),
        read_history(study),
        draft_shares=draft_byte_shares(*store.study_models(study)),
    )
    return state if state.baseline is not None else None
