"""What every stage of the structured search reads: the space's values, the study's trials, the baseline.

``SearchState`` is built once per planned trial from the stored history and never changes; each stage
(``tuner.search.stages``) asks it the same questions: which options are left, what was measured where,
the best of a family, an option's fitted model, whether a plan is new. ``Proposal`` is a stage's answer.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, NamedTuple

from tuner.decisions.drift import PRIOR_LAUNCH_SIGMA, quiet_or_all
from tuner.decisions.evidence import THREAD_TIE
from tuner.search.history import PERMANENT_REASONS, PastTrial
from tuner.search.space import suggest
from tuner.search.speedup_model import UNPAYABLE_MARGIN, DraftFit, Point, byte_ceiling, drafting_share, fit
from tuner.search.stages.configs import (
    K_PROBE,
    SIZE_KNOBS,
    KnobValues,
    PlannedAnswers,
    describe_speculation,
    hardware_of,
    hardware_params,
    is_stacked,
    nearest,
    option_name,
    option_of,
)
from tuner.storage.records import WarmStartPrior

MAX_TIE = (
    0.10  # a tie never spans more than this: a host noisier still needs more repetitions, not a wider tie
)
CLOSE_OPTIONS = 0.03  # another option this close to the incumbent is measured again at least (refinement)


@dataclass(frozen=True)
class Proposal:
    """The next trial's configuration, the stage that chose it and why (stored with the trial)."""

    params: dict[str, Any]
    stage: str
    reason: str


class Start(NamedTuple):
    """The baseline's hardware (and serving) knobs, temperature and experts: where speculation is fitted."""

    hardware: dict
    temperature: Any
    experts: Any


class SearchState:
    """The study's history and space as the stages read them; stateless between planned trials."""

    def __init__(
        self,
        knobs: KnobValues,
        trials: list[PastTrial],
        prior: WarmStartPrior | None = None,
        users: int | None = None,
        saturation: int | None = None,
        draft_shares: dict[str, float] | None = None,
    ):
        """``users``: the level the objective measures (``aggregate_tokens_per_second_c8``: 8), if any;
        ``saturation``: the threads from which the host's memory bandwidth is near its peak (its copy probe);
        ``draft_shares``: each dense draft's weight bytes over the target's (``speedup_model.draft_byte_shares``)."""
        self.knobs, self.trials, self.prior, self.users = knobs, trials, prior or {}, users
        self.saturation = saturation
        self.draft_shares = draft_shares or {}
        self.resolved = knobs.resolved()
        self.taken = [
            r.params
            for r in trials
            if r.state != "failed" or r.failure in PERMANENT_REASONS or r.failure is None
        ]
        self.k_values = knobs.values("draft_max")
        self.baseline = _reference(trials)
        self.tie = _tie(self.baseline, trials)  # rates within this share tie: the thread walk's level
        self.close = _close(self.baseline, trials)  # other options this close: measured at the final hardware

    def measured_baseline(self) -> PastTrial:
        """The baseline trial: the stages run only once it is measured (``planner.next_proposal`` checks)."""
        if self.baseline is None:
            raise RuntimeError("a search stage ran before the baseline was measured")
        return self.baseline

    # -- plans --------------------------------------------------------------------------------

    def params_for(
        self, option: tuple | None, draft_max: int | None, hardware: dict, temperature: Any, experts: Any
    ) -> dict:
        """A plan speculating with ``option`` at K=``draft_max`` on ``hardware``, ``temperature`` and ``experts``."""
        params: dict[str, Any] = {}
        spec, draft = option or ("none", None)
        if self.knobs.has("spec_type"):
            params["spec_type"] = spec
        if spec == "draft-simple":
            params["draft"] = draft
        if spec != "none" and self.k_values and draft_max is not None:
            params["draft_max"] = draft_max
        if self.knobs.has("temperature") and temperature is not None:
            params["temperature"] = temperature
        if self.knobs.has("experts") and experts is not None:
            params["experts"] = experts
        params.update(hardware_params(hardware))
        return params

    def is_new(self, params: dict) -> bool:
        return not any(
            all(params.get(k) == v for k, v in t.items()) and len(t) == len(params) for t in self.taken
        )

    def complete(self, params: dict) -> dict:
        """The knobs a trial of this plan is asked (the real ``suggest``), at the planned or probe values."""
        answers = PlannedAnswers(params)
        suggest(answers, self.resolved)
        return answers.asked

    def first_new(self, candidates) -> Proposal | None:
        """The first of (params, stage, reason) whose completed plan was not tried yet."""
        for params, stage, reason in candidates:
            params = self.complete(params) if params is not None else None
            if params is not None and self.is_new(params):
                return Proposal(params, stage, reason)
        return None

    def probe_sizes(self, option: tuple) -> dict:
        """The n-gram sizes an option's probe runs at (none for a draft model without a lookup)."""
        probe = self.complete(
            self.params_for(
                option, nearest(self.k_values, K_PROBE) if self.k_values else None, {}, None, None
            )
        )
        return {k: v for k, v in probe.items() if k in SIZE_KNOBS}

    # -- what was measured --------------------------------------------------------------------

    def start(self) -> Start:
        params = self.measured_baseline().params
        return Start(hardware_of(params), params.get("temperature"), params.get("experts"))

    def options(self) -> list[tuple]:
        """The space's options (each draft model, each other speculative type), but those blamed."""
        opts: list[tuple] = []
        for spec in self.knobs.values("spec_type"):
            if spec == "draft-simple":
                opts.extend(("draft-simple", d) for d in self.knobs.values("draft"))
            elif spec != "none":
                opts.append((spec, None))
        dead = {option_of(r.params) for r in self.trials if r.blamed}
        return [o for o in opts if o not in dead]

    def measured(self, **match) -> list[PastTrial]:
        return [r for r in self.trials if r.measured and all(r.params.get(k) == v for k, v in match.items())]

    @staticmethod
    def best(trials: list[PastTrial]) -> PastTrial | None:
        """The best feasible trial, completed ones first."""
        good = [r for r in trials if r.feasible and r.state == "complete"] or [
            r for r in trials if r.feasible
        ]
        return max(good, key=lambda r: r.measured_value, default=None)

    def overall_best(self) -> PastTrial | None:
        return self.best([r for r in self.trials if r.measured])

    def alone_at_start(self, option: tuple) -> list[PastTrial]:
        """Measured trials of an option alone (no lookup stacked) at its probe sizes, the baseline's hardware,
        temperature and experts."""
        start = self.start()
        sizes = self.probe_sizes(option)
        return [
            r
            for r in self.measured(**self.params_for(option, None, *start))
            if not is_stacked(r.params) and all(r.params.get(k) == v for k, v in sizes.items())
        ]

    def beyond_reach(self, option: tuple) -> str | None:
        """Why a draft is not worth its probe, or None: a speculation already measured at the start is
        ``UNPAYABLE_MARGIN`` times faster than the draft's byte ceiling (``speedup_model.byte_ceiling``), so
        no K makes it the best (a self-draft of the target in a coarser quant reads most of its bytes)."""
        share = self.draft_shares.get(option[1]) if option[0] == "draft-simple" else None
        if share is None:
            return None
        start = self.start()
        alone = self.target_alone(start.hardware, start.experts)
        rivals = [
            r
            for r in self.trials
            if r.measured
            and r.feasible
            and r.params.get("spec_type", "none") != "none"
            and hardware_of(r.params) == start.hardware
            and r.params.get("experts") == start.experts
        ]
        best = max(rivals, key=lambda r: r.measured_value, default=None)
        ceiling = byte_ceiling(share)
        if not alone or best is None or best.measured_value / alone < UNPAYABLE_MARGIN * ceiling:
            return None
        return (
            f"{option_name(option)} not probed: it reads {share:.0%} of the target's weight bytes a token, so no K "
            f"speeds decode past x{ceiling:.1f}; {describe_speculation(best.params)} measured "
            f"x{best.measured_value / alone:.1f}"
        )

    def target_alone(self, hardware: dict, experts: Any) -> float | None:
        """The best completed rate of the target alone at these hardware knobs and experts."""
        trials = [
            r
            for r in self.measured(spec_type="none")
            if hardware_of(r.params) == hardware
            and r.params.get("experts") == experts
            and r.state == "complete"
        ]
        return max((r.measured_value for r in trials), default=None)

    def fit_option(self, option: tuple, temperature: Any, experts: Any) -> DraftFit | None:
        """The option alone at its probe sizes: a stacked lookup's drafts, or other n-gram sizes, are other curves."""
        points = []
        sizes = self.probe_sizes(option)
        for trial in self.trials:
            if (
                not trial.measured
                or option_of(trial.params) != option
                or trial.params.get("temperature") != temperature
                or trial.params.get("experts") != experts
                or trial.acceptance is None
                or is_stacked(trial.params)
                or any(trial.params.get(k) != v for k, v in sizes.items())
            ):
                continue
            base = self.target_alone(hardware_of(trial.params), experts)
            k = trial.params.get("draft_max") or K_PROBE
            points.append(
                Point(
                    k,
                    trial.acceptance,
                    trial.measured_value / base if base else None,
                    drafting_share(trial.drafted, trial.steps, k),
                )
            )
        return fit(points)

    def family(self, params: dict, *free: str) -> list[PastTrial]:
        """Measured trials that agree with ``params`` except on K, the n-gram sizes and the ``free`` knobs."""
        free_set = set(free) | {"draft_max"} | (set(SIZE_KNOBS) - {"lookup"})
        fixed = {k: v for k, v in params.items() if k not in free_set}
        return [
            r
            for r in self.trials
            if r.measured
            and all(r.params.get(k) == v for k, v in fixed.items())
            and all(k in fixed or k in free_set for k in r.params)
        ]

    def lossless(self, params: dict, knob: str) -> list[PastTrial]:
        """Measured trials with any speculation at ``params``' temperature and experts but ``knob``: speculative
        decoding keeps the target's output distribution, so their quality tells where ``knob`` falls below the floor."""
        same = {k: params.get(k) for k in ("temperature", "experts") if k != knob}
        return [
            r
            for r in self.trials
            if r.measured
            and r.params.get(knob) is not None
            and all(r.params.get(k) == v for k, v in same.items())
        ]

    def line_step(self, params: dict, knob: str = "draft_max", grow: float = 1.5) -> int | None:
        """Next value of a unimodal line search over an integer knob (K, a lookup's length, the n-gram key):
        extend past an edge by ``grow``, else halve the wider gap around the best, until the gaps are within 10%."""
        values = self.knobs.values(knob)
        fixed = {k: v for k, v in params.items() if k != knob}
        by_value: dict[int, float] = {}
        for trial in self.trials:
            if (
                trial.measured
                and trial.feasible
                and trial.params.get(knob) is not None
                and all(trial.params.get(k) == v for k, v in fixed.items())
                and set(trial.params) <= set(params)
            ):
                by_value[trial.params[knob]] = max(
                    by_value.get(trial.params[knob], 0.0), trial.measured_value
                )
        tried = sorted(by_value)
        if not tried or not values:
            return None
        best = max(tried, key=lambda k: by_value[k])
        best_index = tried.index(best)
        left = tried[best_index - 1] if best_index > 0 else None
        right = tried[best_index + 1] if best_index + 1 < len(tried) else None
        for step in _steps(best, left, right, values[0], values[-1], grow):
            step = nearest(values, step)
            if step not in by_value:
                return step
        return None


def _reference(trials: list[PastTrial]) -> PastTrial | None:
    """The target alone as the stages compare with it: the baseline trial, or its first quiet re-measure (a
    sentinel) where the baseline ran on a busy host (as ``drift.Sentinels`` divides speedups: a disturbed baseline
    made every lookup look as if it paid on every suite in a study beside CPU hogs); else the first measured trial
    without speculation."""
    baseline = next((r for r in trials if r.role == "baseline" and r.measured and r.feasible), None)
    if baseline is not None:
        sentinels = [r for r in trials if r.role == "sentinel" and r.measured and r.feasible]
        return quiet_or_all([baseline, *sentinels], lambda r: r.busy)[0]
    return next((r for r in trials if r.measured and r.params.get("spec_type", "none") == "none"), None)


def _close(baseline: PastTrial | None, trials: list[PastTrial]) -> float:
    """The share within which two options compared at the start are within the noise, so refinement measures the
    other at the final configuration: one standard deviation of the difference of two launches, from the spread of
    the baseline configuration's complete measures once there are three, else the study's prior launch spread
    (``drift.PRIOR_LAUNCH_SIGMA``, as pruning and the race assume), at least ``CLOSE_OPTIONS``. Wider than the thread
    tie, which picks between neighbours the race sees again: an option left out here is never measured at the final
    hardware (two drafts within 2% of each other at their best read 9% apart at the start on a launch each:
    docs/decisions.md, "The budget's end")."""
    spread = _launch_spread(baseline, trials)
    return max(math.sqrt(2) * (PRIOR_LAUNCH_SIGMA if spread is None else spread), CLOSE_OPTIONS)


def _launch_spread(baseline: PastTrial | None, trials: list[PastTrial]) -> float | None:
    """The cv of the baseline configuration's complete measures (the baseline and its sentinels: launch to
    launch), once there are three."""
    if baseline is None:
        return None
    same = [r for r in trials if r.params == baseline.params and r.state == "complete" and r.value]
    values = [r.measured_value for r in quiet_or_all(same, lambda r: r.busy)]
    return statistics.stdev(values) / statistics.fmean(values) if len(values) >= 3 else None


def _tie(baseline: PastTrial | None, trials: list[PastTrial]) -> float:
    """The share within which two trials' rates tie on this host: two standard deviations of the difference of
    two trials' figures, between ``evidence.THREAD_TIE`` and ``MAX_TIE``. A trial's noise is the larger of two
    estimates: the spread (cv) of the baseline configuration's complete measures (the baseline and its
    sentinels: launch to launch), once there are three; and the median of the trials' own standard errors
    (``PastTrial.within_error``: pass to pass within a launch, known from the first trial on). A fixed tie
    narrower than the host's own spread tells apart thread counts that are level (evidence:
    docs/decisions.md#thread-ties)."""
    noise = statistics.median(
        [r.within_error for r in trials if r.state == "complete" and r.within_error is not None] or [0.0]
    )
    spread = _launch_spread(baseline, trials)
    if spread is not None:
        noise = max(noise, spread)
    return min(max(2 * math.sqrt(2) * noise, THREAD_TIE), MAX_TIE)


def _steps(best: int, left: int | None, right: int | None, lo: int, hi: int, grow: float) -> list[int]:
    """A line search's next values around ``best``, the wider gap first: past an unmeasured edge by ``grow``,
    else the middle of a gap wider than 10% of ``best``."""
    tol = max(1, round(0.1 * best))
    options = []
    if right is None and best < hi:
        options.append((math.inf, min(hi, max(best + 1, round(best * grow)))))
    elif right is not None and right - best > tol:
        options.append((right - best, (best + right) // 2 if (best + right) // 2 != best else best + 1))
    if left is None and best > lo:
        options.append((math.inf, max(lo, min(best - 1, round(best / grow)))))
    elif left is not None and best - left > tol:
        options.append((best - left, (best + left + 1) // 2 if (best + left + 1) // 2 != best else best - 1))
    return [k for _, k in sorted(options, key=lambda x: -x[0])]
