"""A sampler wrapper that spends no trial on what is already known.

Why: the tuner's knobs are mostly categorical (speculative type, draft, K choices,
threads), so a study's space is a few dozen to a few hundred configurations, and every
trial costs a server launch and a workload. Replaying recorded grids
(`python -m benchmarks bench-search`) showed two ways TPE wastes them:

* it exploits by proposing configurations it has measured, its incumbent above all
  (evidence: docs/decisions.md#tpe);
* it learns nothing from failed trials (Optuna's TPE models complete trials only), so a
  knob value that cannot work, e.g. a prompt-lookup type that finds nothing to draft in
  this workload, keeps its prior share of the proposals and fails again and again.

``NoRepeatSampler`` asks the wrapped sampler first and accepts its proposal unless it
repeats a measured configuration (a pruned one included: it was measured enough to know
it cannot win) or uses a *culprit*: a knob value blamed for bad trials (below the quality
floor, or failed for a reason that will recur) by ``culprits``. Otherwise it tries neighbours of the proposal (one knob resampled at
random, then two, ...), which keeps the search near what TPE believes is good. If no
neighbour is acceptable the blame is dropped (it may be wrong) before repeats are, and
only when every neighbour was measured does the proposal go through as it was.

Lifecycle: ``infer_relative_search_space`` and ``sample_independent`` are the wrapped
sampler's; ``sample_relative`` filters its proposal as above (during the wrapped
sampler's random start-up, a random configuration filtered the same way);
``before_trial``/``after_trial`` are forwarded, so constraints are still recorded.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.measurement.failures import PERMANENT, FailureReason
from tuner.storage.store import failure_reason

# A trial that failed for one of these reasons may succeed next time: not "measured".
TRANSIENT = frozenset(r.value for r in FailureReason if r not in PERMANENT)
TRIES_PER_DISTANCE = 20


def culprits(bad: list[dict[str, Any]], good: list[dict[str, Any]]) -> set[tuple[str, Any]]:
    """Knob values to blame for bad trials, explaining them away a few values at a time.

    A value may be blamed only if it never was in a good trial. The values that appear in
    the most unexplained bad trials (at least two) are blamed, unless two of them appear
    in exactly the same trials: a draft type and a large K that only ever failed together
    could each be the cause, so neither is blamed until a trial tells them apart. Their
    trials are then explained, and the next values are looked for among the rest.
    """
    worked = {item for params in good for item in params.items()}
    unexplained = [set(params.items()) - worked for params in bad]
    blamed: set[tuple[str, Any]] = set()
    while unexplained:
        trials_of: dict[tuple[str, Any], frozenset[int]] = {}
        for index, items in enumerate(unexplained):
            for item in items:
                trials_of[item] = trials_of.get(item, frozenset()) | {index}
        top = max((len(t) for t in trials_of.values()), default=0)
        if top < 2:
            break
        tied = [item for item, t in trials_of.items() if len(t) == top]
        told_apart = {
            item for item in tied if sum(trials_of[other] == trials_of[item] for other in tied) == 1
        }
        if not told_apart:
            break
        blamed |= told_apart
        unexplained = [items for items in unexplained if not items & told_apart]
    return blamed


class NoRepeatSampler(optuna.samplers.BaseSampler):
    def __init__(self, base: optuna.samplers.BaseSampler, seed: int | None = None):
        self.base = base
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._rng = np.random.RandomState(seed)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self.base.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        proposal = self.base.sample_relative(study, trial, search_space)
        if not search_space:
            return proposal
        trials = study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
        )
        # bad: below the quality floor, or failed for a reason that will recur
        good: list[dict[str, Any]] = []
        bad: list[dict[str, Any]] = []
        pruned: list[dict[str, Any]] = []
        for past in trials:
            if past.state == TrialState.COMPLETE:
                (good if all(v <= 0 for v in past.constraints.values()) else bad).append(past.params)
            elif (
                past.state == TrialState.PRUNED
            ):  # measured enough to know it cannot win: taken, blamed for nothing
                pruned.append(past.params)
            elif failure_reason(past) not in TRANSIENT:
                bad.append(past.params)
        measured = good + bad + pruned
        blamed = culprits(bad, good)

        def is_new(params: dict[str, Any]) -> bool:
            # A measured trial holds only the knobs it was asked (no draft without speculation):
            # the candidate repeats it when it agrees on all of those.
            return not any(
                all(k not in search_space or params.get(k) == v for k, v in p.items()) for p in measured
            )

        def blameless(params: dict[str, Any]) -> bool:
            return is_new(params) and not any((k, v) in blamed for k, v in params.items())

        start = proposal or {name: self._resample(study, trial, name, d) for name, d in search_space.items()}
        names = sorted(search_space)
        for acceptable in (blameless, is_new):  # a wrong blame must not stop the search
            if acceptable(start):
                return start
            for distance in range(1, len(names) + 1):
                for _ in range(TRIES_PER_DISTANCE):
                    candidate = dict(start)
                    for index in self._rng.choice(len(names), size=distance, replace=False):
                        candidate[names[index]] = self._resample(
                            study, trial, names[index], search_space[names[index]]
                        )
                    if acceptable(candidate):
                        return candidate
        return proposal

    def _resample(
        self, study: optuna.Study, trial: FrozenTrial, name: str, distribution: BaseDistribution
    ) -> Any:
        return self._random.sample_independent(study, trial, name, distribution)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
        self._random.reseed_rng()
        self._rng = np.random.RandomState()


def sampler_for(name: str, seed: int, budget_trials: int) -> optuna.samplers.BaseSampler:
    """Default TPE: multivariate with groups handles the conditional knobs (K only when
    speculating); the quality floor reaches every sampler through ``trial.set_constraint``;
    its startup is short because budgets are;
    it never re-measures a configuration nor proposes a knob value blamed for failed or
    infeasible trials (see tuner.search.sampling). Separate from the spec so
    `python -m benchmarks bench-search` replays exactly these settings."""
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(20, budget_trials // 3)))
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "structured":  # stages and a model of speculation; NoRepeat(TPE) where it has no plan
        from tuner.search.structured_sampler import StructuredSampler

        return StructuredSampler(sampler_for("tpe", seed, budget_trials), seed=seed)
    with warnings.catch_warnings():  # multivariate/group are "experimental" since Optuna 2.x
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        tpe = optuna.samplers.TPESampler(
            seed=seed,
            multivariate=True,
            group=True,
            # 5, not TPE's 10: the wrapper's start-up already spreads over unmeasured, unblamed
            # configurations, so TPE's model may take over sooner (evidence: docs/decisions.md#tpe).
            n_startup_trials=max(4, min(5, budget_trials // 4)),
        )
    return NoRepeatSampler(tpe, seed=seed)
