"""How much a race launch measures: a part of the workload, one pass or several, from what the study measured.

Why: a race's unit is the launch. Its rate carries the launch's own effect (spread ``L``, the sentinels') and
the noise of its pass (spread ``R`` for one full pass, the trials' repetitions; ``R / sqrt(m)`` over ``m``
passes' worth of requests). Its cost is a fixed part ``F`` (start, model load, warm-up) and ``m`` times a pass's
``P`` seconds. The variance of a launch's rate per second spent, ``(F + m P) (L^2 + R^2 / m)``, is least at
``m* = sqrt(F / P) R / L``: the optimum sub-sample of two-stage sampling (Cochran, *Sampling Techniques*, 3rd ed.,
section 10.6). When the launch spread dominates and a launch is cheap, shorter passes and more launches decide
sooner; when a pass is noisy and a launch dear (a large model's load), several passes per launch.

A part of a pass is stratified: each suite keeps its share of the requests, so the mix of content a launch
measures is the same in every round, and the part rotates through the suite's entries round by round, the same
part for every finalist of a round (the race's round effects take out what a part does to everyone). A size is
used only where it saves at least ``MIN_SAVING`` of the time to a given precision: the spreads it is built on are
estimates, and a full pass is what the trials measured.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tuner.decisions.evidence import DECISION_ROUNDS
from tuner.measurement.workload import Prompt, Workload
from tuner.storage.records import TrialRecord

MAX_PASSES = 4  # a launch measures at most this many passes
MIN_SAVING = 0.10  # a size other than one pass must save at least this share of the time to a precision


def optimum_share(launch_sigma: float, pass_sigma: float, fixed_s: float, pass_s: float) -> float:
    """``m*``: the passes per launch (a fraction: a part of one) that give the most precision per second."""
    if launch_sigma <= 0:
        return float(MAX_PASSES)
    if pass_s <= 0 or pass_sigma <= 0:
        return 1.0
    return math.sqrt(max(fixed_s, 0.0) / pass_s) * pass_sigma / launch_sigma


def relative_cost(
    share: float, launch_sigma: float, pass_sigma: float, fixed_s: float, pass_s: float
) -> float:
    """Time to a given precision at ``share`` passes per launch, over the time at one full pass."""

    def cost(passes: float) -> float:
        return (fixed_s + passes * pass_s) * (launch_sigma**2 + pass_sigma**2 / passes)

    return cost(share) / cost(1.0) if cost(1.0) > 0 else 1.0


@dataclass(frozen=True)
class LaunchSize:
    """What each race launch measures: ``per_suite`` entries of each suite (a part of a pass), or ``passes`` passes."""

    share: float  # passes per launch as sized (a part when below 1)
    passes: int  # whole passes per launch (1 with a part)
    per_suite: dict[str, int]  # entries per suite in a part; empty: every entry
    launch_sigma: float
    pass_sigma: float
    fixed_s: float
    pass_s: float
    capped: str = ""  # why fewer passes than the optimum: more would leave a race too few rounds to decide

    @property
    def saving(self) -> float:
        """The share of the time to a given precision this size saves against one full pass."""
        return 1.0 - relative_cost(self.share, self.launch_sigma, self.pass_sigma, self.fixed_s, self.pass_s)

    def rounds(self, max_rounds: int) -> int:
        """``race.max_rounds`` at this size: as many rounds as fit in the time of ``max_rounds`` rounds of one
        pass per launch (a part of a pass gives more, several passes fewer, at least 3)."""
        return max(round(max_rounds * (self.fixed_s + self.pass_s) / self.launch_s), 3)

    @property
    def launch_s(self) -> float:
        return self.fixed_s + self.share * self.pass_s

    def text(self) -> str:
        what = (
            f"{', '.join(f'{n} {s}' for s, n in self.per_suite.items())} entries of a pass"
            if self.per_suite
            else f"{self.passes} pass{'es' if self.passes > 1 else ''}"
        )
        basis = (
            f"launch spread {self.launch_sigma:.1%}, one pass's {self.pass_sigma:.1%}; a launch's fixed "
            f"{self.fixed_s:.0f} s against a pass's {self.pass_s:.0f} s"
        )
        if self.capped:
            return f"each launch measures {what} ({basis}; {self.capped})"
        if self.share == 1.0 and not self.per_suite:
            return f"each launch measures one pass ({basis}: no other size saves {MIN_SAVING:.0%})"
        return f"each launch measures {what} ({basis}: {self.saving:.0%} less time to the same precision)"

    def workload(self, workload: Workload, round_index: int) -> Workload:
        """The part of ``workload`` round ``round_index`` measures: per suite, the next ``per_suite`` entries."""
        if not self.per_suite:
            return workload
        chosen: list[Prompt] = []
        for suite in workload.suites:
            entries = [p for p in workload.prompts if p.suite == suite]
            count = min(self.per_suite.get(suite, len(entries)), len(entries))
            start = round_index * count
            chosen += [entries[(start + i) % len(entries)] for i in range(count)]
        return Workload(tuple(chosen))


def size(
    launch_sigma: float,
    pass_sigma: float,
    fixed_s: float,
    pass_s: float,
    suites: dict[str, int],
    max_rounds: int | None = None,
) -> LaunchSize:
    """The launch size for these spreads and costs over a workload of ``suites`` (entries per suite): a
    stratified part (at least one entry per suite), one pass, or up to ``MAX_PASSES`` passes; one pass unless
    the other saves ``MIN_SAVING``. With ``max_rounds`` (race.max_rounds), never so many passes that the race's
    time holds fewer rounds than a decision needs (``DECISION_ROUNDS``, or race.max_rounds where it is below
    that): a race too short to decide deploys the baseline whatever it measured."""
    one = LaunchSize(1.0, 1, {}, launch_sigma, pass_sigma, fixed_s, pass_s)
    best = optimum_share(launch_sigma, pass_sigma, fixed_s, pass_s)
    total = sum(suites.values())
    if best >= 1.5:
        passes = min(round(best), MAX_PASSES)
        candidate = LaunchSize(float(passes), passes, {}, launch_sigma, pass_sigma, fixed_s, pass_s)
        if max_rounds is not None:
            candidate = _within_rounds(candidate, max_rounds)
            if candidate.passes == 1:
                return candidate
    elif best <= 0.75 and total > len(suites):
        per_suite = {s: max(1, round(best * n)) for s, n in suites.items()}
        share = sum(per_suite.values()) / total
        if share >= 1.0:
            return one
        candidate = LaunchSize(share, 1, per_suite, launch_sigma, pass_sigma, fixed_s, pass_s)
    else:
        return one
    return candidate if candidate.saving >= MIN_SAVING else one


def _within_rounds(chosen: LaunchSize, max_rounds: int) -> LaunchSize:
    """``chosen``, or fewer passes per launch where its launches leave fewer rounds than a decision needs; the
    size says which it used and why."""
    needed = min(DECISION_ROUNDS, max_rounds)
    passes = chosen.passes
    while passes > 1 and replace(chosen, share=float(passes), passes=passes).rounds(max_rounds) < needed:
        passes -= 1
    if passes == chosen.passes:
        return chosen
    why = (
        f"{chosen.passes} passes, the optimum, would leave {chosen.rounds(max_rounds)} rounds in race.max_rounds' "
        f"time, fewer than the {needed} a decision needs"
    )
    return replace(chosen, share=float(passes), passes=passes, capped=why)


def from_trials(
    records: Sequence[TrialRecord], launch_sigma: float, workload: Workload, max_rounds: int | None = None
) -> LaunchSize | None:
    """The size from a study's complete trials: a pass's spread pooled from their repetitions (the cv of
    per-pass rates), a pass's time from their requests' wall time, a launch's fixed time from the rest of each
    trial (start, load, warm-up, scoring). None when no trial measured two passes (a pass's spread unknown)."""
    complete = [(r, r.spread) for r in records if r.complete and r.spread is not None]
    cvs = [spread.cv for _, spread in complete if spread.cv is not None and spread.repetitions >= 2]
    timed = [  # (duration, requests, passes) of each trial that timed its passes
        (r.duration_s, r.samples, spread.repetitions)
        for r, spread in complete
        if r.duration_s and r.samples and spread.repetitions
    ]
    if not cvs or not timed:
        return None
    pass_sigma = math.sqrt(statistics.fmean(cv * cv for cv in cvs))
    passes = [
        sum(s.get("wall_ms", 0.0) for s in samples) / 1000 / repetitions for _, samples, repetitions in timed
    ]
    fixed = [duration - p * repetitions for (duration, _, repetitions), p in zip(timed, passes)]
    suites = {s: sum(p.suite == s for p in workload.prompts) for s in workload.suites}
    return size(
        launch_sigma,
        pass_sigma,
        max(statistics.median(fixed), 0.0),
        statistics.median(passes),
        suites,
        max_rounds,
    )
