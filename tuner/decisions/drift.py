"""Drift sentinels: the baseline configuration re-measured during a study, the reference that moves.

Why: on a shared or thermally limited machine one configuration measures 20-30% apart
minutes later. Dividing every trial by one baseline measured at the start turns that
drift into fake speedups. A study therefore re-measures the baseline configuration every
``sentinel.every_trials`` trials or ``sentinel.every_minutes`` (whichever comes first),
stores each as a trial with role ``sentinel``, and divides each trial's tokens/s by the
sentinel rate interpolated at the trial's midpoint, from the sentinels of the same
worker (each host drifts on its own). The baseline trial is the first sentinel.

A trial is flagged ``drifted`` when the two sentinels around it differ by more than the
noise: twice the larger of their spreads (cv) and the study's noise_cv.

A reference reading on a busy host (``machine.host.host_was_busy``: other processes took CPU during it) is left
out of its worker's series once the worker has a quiet one: a busy reading never divides a speedup, and a busy
baseline is named, not shown (``DisturbedBaseline``). The baseline trial launches again at once when its launch
ran on a busy host (``run/trial_measurement.BUSY_RELAUNCHES``); the busy launches it set aside
(``host["busy_readings"]``) are readings of the series too, before the trial's own.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tuner.machine.host import busy_text, host_was_busy
from tuner.storage.records import TrialRecord
from tuner.studyfile.spec import SentinelSpec

REFERENCE_ROLES = ("baseline", "sentinel")
PRIOR_LAUNCH_SIGMA = (
    0.05  # launch-to-launch spread assumed until three reference runs of a worker measured it
)
PRIOR_WEIGHT = 2  # the prior counts as this many measured steps: two steps barely measure a spread
MIN_LAUNCH_SIGMA = 0.02
SPREAD_LEVEL = 0.9  # the launch spread decisions allow: this upper quantile of what the reference runs show

Reading = TypeVar("Reading")


@dataclass(frozen=True)
class Point:
    at: float  # the measurement's midpoint, seconds since the epoch
    tokens_per_second: float
    cv: float | None
    busy: str = ""  # ``host busy: NAME[PID]`` when other processes took CPU during it (``busy_of``)


def set_aside(record: TrialRecord) -> list[Point]:
    """The launches a reference trial set aside because its host was busy (``host["busy_readings"]``), as readings
    just before its own."""
    start = record.started_at or 0.0
    readings = (record.host or {}).get("busy_readings") or []
    return [Point(start + i * 1e-3, r["tokens_per_second"], None, r["busy"]) for i, r in enumerate(readings)]


def busy_of(record: TrialRecord) -> str:
    """``host busy: NAME[PID], ...`` when the record's host was busy while it measured, else ""."""
    return busy_text(record.host["busy_processes"]) if record.host and host_was_busy(record.host) else ""


def midpoint(record: TrialRecord) -> float | None:
    if record.started_at is None or record.ended_at is None:
        return None
    return (record.started_at + record.ended_at) / 2


@dataclass(frozen=True)
class DisturbedBaseline:
    """A baseline whose first reading its sentinels contradict: the figure kept, the one used, and from how many."""

    first: float  # tokens/s of the first reading
    remeasured: float  # the sentinels' median
    sentinels: int
    busy: str = (
        ""  # ``host busy: ...``: left out because its host was busy; "": because the sentinels disagree
    )

    def text(self) -> str:
        if self.busy:
            return (
                f"the baseline's first reading ({self.first:.1f} tokens/s) ran on a busy host ({self.busy}); "
                f"speedups use its {self.sentinels} quiet re-measure(s) (median {self.remeasured:.1f} tokens/s)"
            )
        return (
            f"the baseline's first reading ({self.first:.1f} tokens/s) disagrees with its {self.sentinels} "
            f"re-measures (median {self.remeasured:.1f} tokens/s) beyond the noise: the host was disturbed during "
            "it; speedups use the re-measured baseline"
        )


class Sentinels:
    """The reference rate of each worker over time, from its baseline and sentinel trials."""

    def __init__(self, records: list[TrialRecord], noise_cv: float):
        self.noise_cv = noise_cv
        self.points: dict[str, list[Point]] = {}
        for record in records:
            at = midpoint(record)
            if record.role in REFERENCE_ROLES and record.complete and at is not None:
                self.points.setdefault(record.worker, []).extend(set_aside(record))
                self.points.setdefault(record.worker, []).append(
                    Point(
                        at,
                        record.measured_metrics.tokens_per_second,
                        record.spread.cv if record.spread else None,
                        busy_of(record),
                    )
                )
        self.disturbed: dict[str, DisturbedBaseline] = {}
        for worker, series in self.points.items():
            series.sort(key=lambda p: p.at)
            disturbed = _busy(series) or _disturbed(series, noise_cv)
            if disturbed is not None:  # the reference is the sentinels': the first reading is left out
                self.disturbed[worker] = disturbed
            self.points[worker] = _kept(series, disturbed is not None)

    def _around(self, worker: str, at: float) -> tuple[Point, Point] | None:
        series = self.points.get(worker)
        if not series:
            return None
        index = bisect.bisect_left([p.at for p in series], at)
        before, after = series[max(index - 1, 0)], series[min(index, len(series) - 1)]
        return before, after

    def rate_at(self, worker: str, at: float) -> float | None:
        """Linear between the sentinels around ``at``; the nearest one outside them."""
        around = self._around(worker, at)
        if around is None:
            return None
        before, after = around
        if after.at == before.at:
            return before.tokens_per_second
        weight = min(max((at - before.at) / (after.at - before.at), 0.0), 1.0)
        return before.tokens_per_second + weight * (after.tokens_per_second - before.tokens_per_second)

    def steps(self, worker: str) -> list[float]:
        """Log-ratios of consecutive reference runs of one worker: each a difference of two launches."""
        series = self.points.get(worker) or []
        return [
            math.log(b.tokens_per_second / a.tokens_per_second)
            for a, b in zip(series, series[1:])
            if a.tokens_per_second > 0 and b.tokens_per_second > 0
        ]

    def launch_sigma(self, worker: str) -> float | None:
        """The launch-to-launch spread of one configuration on this worker, in log terms: the RMS of the
        log-ratios of consecutive reference runs over sqrt(2) (drift counts as spread: a pruner that
        uses it errs towards measuring on). None before the second reference run."""
        steps = self.steps(worker)
        return math.sqrt(sum(d * d for d in steps) / len(steps) / 2) if steps else None

    def launch_spread(self, worker: str | None = None) -> float:
        """The launch spread a decision allows (pruning bound, finalists), the widest worker's when none is
        named: ``allowed_launch_spread`` of its reference runs."""
        workers = [worker] if worker is not None else list(self.points) or [""]
        return max(allowed_launch_spread(self.steps(w)) for w in workers)

    def launch_estimate(self) -> float:
        """The launch spread's point estimate, the widest worker's (``estimated_launch_spread``)."""
        return max(estimated_launch_spread(self.steps(w)) for w in list(self.points) or [""])

    def drifted(self, worker: str, at: float) -> bool:
        """The sentinels around ``at`` moved by more than the noise."""
        around = self._around(worker, at)
        if around is None:
            return False
        before, after = around
        noise = 2 * max(before.cv or 0.0, after.cv or 0.0, self.noise_cv)
        return (
            abs(after.tokens_per_second - before.tokens_per_second)
            / ((before.tokens_per_second + after.tokens_per_second) / 2)
            > noise
        )

    def busy_reference(self, worker: str) -> str:
        """``host busy: ...`` of the worker's latest reference reading while every one of them ran on a busy host
        (a speedup divided now divides by a disturbed reading), else ""."""
        series = self.points.get(worker) or []
        return series[-1].busy if series and all(p.busy for p in series) else ""

    def disturbed_baseline(self, worker: str) -> DisturbedBaseline | None:
        """The worker's baseline reading when its sentinels contradicted it (``_disturbed``), else None."""
        return self.disturbed.get(worker)

    def speedup(self, record: TrialRecord) -> float | None:
        at = midpoint(record)
        rate = self.rate_at(record.worker, at) if at is not None and record.complete else None
        return record.measured_metrics.tokens_per_second / rate if rate else None


def _busy(series: list[Point]) -> DisturbedBaseline | None:
    """The first reference reading (the baseline) when its host was busy and a later one was quiet: the quiet
    ones' median stands for it."""
    quiet = [p.tokens_per_second for p in series[1:] if not p.busy]
    if not series or not series[0].busy or not quiet:
        return None
    return DisturbedBaseline(
        series[0].tokens_per_second, statistics.median(quiet), len(quiet), series[0].busy
    )


def quiet_or_all(readings: Sequence[Reading], busy: Callable[[Reading], bool]) -> list[Reading]:
    """The readings a reference is drawn from, in order: the quiet ones once one exists, else all of them. Why: a
    reading on a busy host measures the host, not the configuration; the one place for this rule (the series here,
    the search's reference and launch spread in ``search/stages/state``)."""
    quiet = [r for r in readings if not busy(r)]
    return quiet or list(readings)


def _kept(series: list[Point], first_out: bool) -> list[Point]:
    """The readings a worker's reference rate is drawn from: the first left out when it was disturbed, and every
    reading on a busy host once a quiet one exists."""
    return quiet_or_all(series[1:] if first_out else series, lambda p: bool(p.busy))


def _disturbed(series: list[Point], noise_cv: float) -> DisturbedBaseline | None:
    """The first reference reading (the baseline) when the sentinels after it, at least two and agreeing with each
    other within the noise, all put the configuration elsewhere beyond it: that launch ran beside something."""
    if len(series) < 3:
        return None
    first, later = series[0], series[1:]
    remeasured = statistics.median(p.tokens_per_second for p in later)
    if remeasured <= 0:
        return None
    noise = 2 * max(max((p.cv or 0.0) for p in series), noise_cv)
    spread = (max(p.tokens_per_second for p in later) - min(p.tokens_per_second for p in later)) / remeasured
    if spread > noise or abs(first.tokens_per_second / remeasured - 1) <= noise:
        return None
    return DisturbedBaseline(first.tokens_per_second, remeasured, len(later))


def allowed_launch_spread(steps: list[float]) -> float:
    """From consecutive reference runs' log-ratios: the conservative prior before two steps (three runs), then
    an upper bound of the spread: the ``SPREAD_LEVEL`` quantile of its posterior given the steps and
    ``PRIOR_WEIGHT`` pseudo-steps at the prior (a scaled inverse chi-square; Wilson-Hilferty's chi-square
    quantile), floored at ``MIN_LAUNCH_SIGMA``. Why an upper bound: three sentinels (two steps) underestimate a
    spread half of the time, and the decisions that allow it (pruning, the finalist cut) err when it is low: with
    the shrunk estimate alone, a noisy host prunes configurations as good as the incumbent and cuts the true best
    from the finalists far more often than the decisions' confidence allows."""
    if len(steps) < 2:
        return PRIOR_LAUNCH_SIGMA
    df = len(steps) + PRIOR_WEIGHT
    squares = sum(d * d for d in steps) / 2 + PRIOR_WEIGHT * PRIOR_LAUNCH_SIGMA**2
    return max(math.sqrt(squares / chi2_quantile(1 - SPREAD_LEVEL, df)), MIN_LAUNCH_SIGMA)


def estimated_launch_spread(steps: list[float]) -> float:
    """The spread's point estimate: the same steps and prior pseudo-steps as ``allowed_launch_spread``, their
    pooled mean square (the shrunk estimate). Why not the upper bound: sizing a launch (``launch_size``) weighs the
    launch spread against a pass's, and an inflated one buys shorter passes that cost more launches."""
    df = len(steps) + PRIOR_WEIGHT
    return math.sqrt((sum(d * d for d in steps) / 2 + PRIOR_WEIGHT * PRIOR_LAUNCH_SIGMA**2) / df)


def chi2_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of chi-square with ``df`` degrees of freedom (Wilson-Hilferty, from ``z``, the standard
    normal's ``p`` quantile; exact for 2)."""
    if df == 2:
        return -2 * math.log(1 - p)
    z = statistics.NormalDist().inv_cdf(p)
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def sentinel_due(records: list[TrialRecord], worker: str, spec: SentinelSpec, now: float) -> bool:
    """Whether this worker should re-measure the baseline before its next trial: every ``every_trials`` trials
    or ``every_minutes``, and after each trial while every reference reading it has ran on a busy host (at most
    ``after_busy`` such readings): until a quiet one exists, every speedup divides by a disturbed reading (a
    10-trial study beside two CPU hogs divided its first five trials by a baseline read at 19% of its quiet rate)."""
    mine = [(r, r.ended_at) for r in records if r.worker == worker and r.ended_at is not None]
    references = [(r, ended) for r, ended in mine if r.role in REFERENCE_ROLES and r.complete]
    if not references:
        return False  # no baseline measured here yet: the baseline comes first anyway
    last = max(ended for _, ended in references)
    since = [r for r, ended in mine if r.role not in REFERENCE_ROLES and ended > last]
    if len(since) >= spec.every_trials:
        return True
    all_busy = all(r.host and host_was_busy(r.host) for r, _ in references)
    if since and all_busy and len(references) <= spec.after_busy:
        return True
    return bool(since) and spec.every_minutes is not None and now - last >= 60 * spec.every_minutes
