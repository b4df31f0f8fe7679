"""A sampler wrapper that never spends a trial re-measuring a configuration.

Why: the tuner's knobs are mostly categorical (speculative type, draft, K choices,
threads), so a study's space is a few dozen to a few hundred configurations. TPE
exploits by proposing its incumbent again and again (on a recorded demo grid about a
third of its trials were repeats), and every repeat costs a server launch and a
workload. ``NoRepeatSampler`` asks the wrapped sampler first; when its proposal was
already measured, it measures a neighbour instead: the proposal with one knob
resampled at random, then two, and so on, which keeps the search near what TPE
believes is good. Only when every neighbour was measured does it let the repeat through.

Lifecycle: ``infer_relative_search_space`` and ``sample_independent`` are the wrapped
sampler's; ``sample_relative`` filters its proposal as above (during the wrapped
sampler's random start-up, a random configuration that was not measured yet);
``before_trial``/``after_trial`` are forwarded, so constraints are still recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.failures import PERMANENT, FailureReason

# A trial that failed for one of these reasons may succeed next time: not "measured".
TRANSIENT = frozenset(r.value for r in FailureReason if r not in PERMANENT)
TRIES_PER_DISTANCE = 20


class NoRepeatSampler(optuna.samplers.BaseSampler):
    def __init__(self, base: optuna.samplers.BaseSampler, seed: int | None = None):
        self.base = base
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._rng = np.random.RandomState(seed)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.base.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        proposal = self.base.sample_relative(study, trial, search_space)
        if not search_space:
            return proposal
        measured = [t.params for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
                    if t.state == TrialState.COMPLETE or t.user_attrs.get("failure_reason") not in TRANSIENT]

        def is_new(params: dict[str, Any]) -> bool:
            # A measured trial holds only the knobs it was asked (no draft without speculation):
            # the candidate repeats it when it agrees on all of those.
            return not any(all(k not in search_space or params.get(k) == v for k, v in p.items()) for p in measured)

        start = proposal or {name: self._resample(study, trial, name, d) for name, d in search_space.items()}
        if is_new(start):
            return start
        names = sorted(search_space)
        for distance in range(1, len(names) + 1):
            for _ in range(TRIES_PER_DISTANCE):
                candidate = dict(start)
                for i in self._rng.choice(len(names), size=distance, replace=False):
                    candidate[names[i]] = self._resample(study, trial, names[i], search_space[names[i]])
                if is_new(candidate):
                    return candidate
        return proposal

    def _resample(self, study: optuna.Study, trial: FrozenTrial, name: str, distribution: BaseDistribution) -> Any:
        return self._random.sample_independent(study, trial, name, distribution)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
        self._random.reseed_rng()
        self._rng = np.random.RandomState()
