"""Launch-level evidence: paired per-round ratios, their t-interval, "shown better", "shown equivalent", outliers.

Why: on a real host every launch of a server runs a few percent faster or slower than the last,
so the unit of evidence is the launch. A race round launches each contender once and measures
one pass; two contenders' rates in one round are a pair (same minutes of the machine). The
figure for "A over B" is the geometric mean of the per-round ratios, and its interval is
Student's t on the log ratios: with lognormal launch and round noise the interval covers at
its nominal rate at any number of rounds, where a percentile bootstrap over a few rounds covers
far less often (evidence: docs/decisions.md#the-t-interval). Below ``MIN_ROUNDS`` a figure is printed
but marked "too few rounds", and nothing (a tie, a per-type entry) is decided on it.

Decisions (the sequential race, ``tuner.decisions.race``) use a ``Gap``: log(A/B) from the additive model
log rate = contender + round fitted to every launch of the race (``pooled_spread``: a round that ran slow
for everyone is not spread, and a contender that rested still compares through the rounds' shifts),
bounded per launch with the race's pooled spread, or with the pair's own where it is wider than the pooled one by
more than chance explains (``OWN_SPREAD_LEVEL``). Pooling gives the t quantile the degrees of freedom of the whole
race: 8 after three rounds of five contenders, where one pair has 2, and at the race's level (5% over 4
comparisons and 8 looks) t is 4.2 at 8 degrees of freedom and 17.8 at 2. The test keeps a noisier pair from
borrowing a quieter race's spread, without a pair whose few rounds came out wide by chance widening its bound.

* A is *shown better* than B when the one-sided ``1 - alpha`` lower bound of mean log(A/B) is above 0;
* A and B are *shown equivalent* within a margin m (TOST): the ``1 - 2 alpha`` interval of the
  ratio lies inside (1/(1+m), 1+m) (per-type and older callers; the race bounds a loss instead).

Student's t is computed here (exact series for integer degrees of freedom, checked against the tables
in tests/test_decisions.py) rather than taken from scipy: every caller uses integer degrees of freedom,
and scipy would add about 40 MB to every install for two functions.

A round is an *outlier* for a contender when its rate is impossible (not a positive finite
number) or its log is more than ``OUTLIER_MADS`` scaled MADs from the median of the contender's
other rounds (the MAD floored at ``MAD_FLOOR``: a few close rounds do not make an ordinary launch an outlier).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tuner import figure_text
from tuner.decisions.drift import chi2_quantile

CONFIDENCE = 0.95
ALPHA = 0.05  # one-sided, per comparison and look, in the sequential race
OWN_SPREAD_LEVEL = 0.05  # a pair's own spread bounds its gap when wider than the pool's at this level
MIN_ROUNDS = 3  # fewer paired rounds give no decision (and a t-interval with 1 degree of freedom)
# Paired rounds a close pair's bound needs before a race decides on it, and the first round a race may stop at: the
# few early bounds narrow enough to decide on are mostly those whose spread came out low by luck (docs/decisions.md).
DECISION_ROUNDS = 5
# Two thread counts whose rates are within this share of each other tie, and the fewer threads win (the resource
# rule): about one standard deviation of the difference of two single launches at a quiet host's 1.5% launch
# spread, the floor of SearchState.tie, which widens to the spread a host's re-measures show.
THREAD_TIE = 0.02
OUTLIER_MADS = 5.0
MAD_FLOOR = (
    0.1  # log terms: with 5 MADs no launch within a factor 1.65 of the median is an outlier (a lower floor
)
# would leave out ordinary launches on a noisy host, trimming the spread the intervals rely on:
# docs/decisions.md#outlier-floor)
MAD_SCALE = 1.4826  # MAD -> standard deviation for normal data


def t_cdf(t: float, df: int) -> float:
    """Student's t distribution function for an integer number of degrees of freedom (exact series)."""
    if df < 1:
        raise ValueError("df must be >= 1")
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd
        term, total = 1.0, 0.0
        if df > 1:
            total = 1.0
            for index in range(1, (df - 3) // 2 + 1):
                term *= c2 * (2 * index) / (2 * index + 1)
                total += term
            total *= math.sin(theta) * math.cos(theta)
        inside = 2 / math.pi * (theta + total)
    else:
        term, total = 1.0, 1.0
        for index in range(1, (df - 2) // 2 + 1):
            term *= c2 * (2 * index - 1) / (2 * index)
            total += term
        inside = math.sin(theta) * total
    return 0.5 + math.copysign(inside / 2, t)


@functools.lru_cache(maxsize=None)
def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t (bisection on ``t_cdf``)."""
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def geometric_mean(values: Sequence[float]) -> float:
    """The figure of one contender over its launches (0 when a launch measured nothing)."""
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values and min(values) > 0 else 0.0


def log_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-round log(a/b); rounds where either rate is not positive are left out."""
    if len(a) != len(b):
        raise ValueError("paired rounds need the same number of rates")
    return [math.log(x / y) for x, y in zip(a, b) if x > 0 and y > 0]


@dataclass(frozen=True)
class Ratio:
    """A over B from paired rounds: the geometric mean of per-round ratios and its t-interval."""

    estimate: float
    low: float
    high: float
    rounds: int
    confidence: float = CONFIDENCE

    @property
    def enough(self) -> bool:
        return self.rounds >= MIN_ROUNDS

    def text(self) -> str:
        """``x1.31 [1.25, 1.38]``, or the estimate marked when the rounds are too few for an interval (an
        infinite bound), and words where there is no estimate (no paired rounds, a rate of zero)."""
        if not figure_text.finite(self.estimate) or self.estimate <= 0:
            return f"no speedup figure ({self.rounds} paired round{'s' if self.rounds != 1 else ''})"
        estimate = f"x{self.estimate:.2f}"
        if self.rounds < 2 or not (figure_text.finite(self.high) and self.low > 0):
            return f"{estimate} ({self.rounds} round{'s' if self.rounds != 1 else ''}: no interval)"
        figure = f"{estimate} [{self.low:.2f}, {self.high:.2f}]"
        return figure if self.enough else f"{figure} (too few rounds: {self.rounds} < {MIN_ROUNDS})"


def _mean_sd(logs: list[float]) -> tuple[float, float]:
    return statistics.fmean(logs), statistics.stdev(logs) if len(logs) > 1 else math.inf


def _bounds(logs: list[float], two_sided_level: float) -> tuple[float, float]:
    """The two-sided ``two_sided_level`` t-interval of the mean log ratio (infinite with one round)."""
    rounds = len(logs)
    mean, sd = _mean_sd(logs)
    if rounds < 2:
        return -math.inf, math.inf
    half = t_quantile(1 - (1 - two_sided_level) / 2, rounds - 1) * sd / math.sqrt(rounds)
    return mean - half, mean + half


def ratio(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Ratio:
    logs = log_ratios(a, b)
    if not logs:
        return Ratio(math.nan, math.nan, math.nan, 0, confidence)
    low, high = _bounds(logs, confidence)
    return Ratio(
        math.exp(statistics.fmean(logs)),
        math.exp(low) if low > -math.inf else 0.0,
        math.exp(high) if high < math.inf else math.inf,
        len(logs),
        confidence,
    )


def shown_better(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA) -> bool:
    """A is faster than B: the one-sided ``1 - alpha`` lower bound of mean log(A/B) is above 0."""
    logs = log_ratios(a, b)
    return len(logs) >= MIN_ROUNDS and _bounds(logs, 1 - 2 * alpha)[0] > 0


def shown_equivalent(a: Sequence[float], b: Sequence[float], margin: float, alpha: float = ALPHA) -> bool:
    """TOST: A and B are within ``margin`` of each other (both one-sided tests at ``alpha``)."""
    logs = log_ratios(a, b)
    if len(logs) < MIN_ROUNDS:
        return False
    low, high = _bounds(logs, 1 - 2 * alpha)
    return -math.log1p(margin) < low and high < math.log1p(margin)


def is_outlier(value: float, others: Sequence[float]) -> bool:
    """``value`` is impossible, or more than ``OUTLIER_MADS`` scaled MADs (log terms) from the median of ``others``."""
    if not (value > 0 and math.isfinite(value)):
        return True
    logs = [math.log(v) for v in others if v > 0 and math.isfinite(v)]
    if len(logs) < 2:
        return False
    centre = statistics.median(logs)
    mad = max(MAD_SCALE * statistics.median(abs(x - centre) for x in logs), MAD_FLOOR)
    return abs(math.log(value) - centre) > OUTLIER_MADS * mad


# ------------------------------------------------------------------ the race's evidence


@dataclass(frozen=True)
class Spread:
    """The per-launch spread of a race in log terms, pooled over every contender and round, its degrees of
    freedom, each contender's fitted log rate (its estimate with every round's shift taken out), and the variance
    of each difference of fitted rates in units of the per-launch variance (``contrast[a][b]``; 2/n for two
    contenders launched together in n rounds)."""

    sigma: float
    df: int
    effects: dict[str, float]
    contrast: dict[str, dict[str, float]] = field(default_factory=dict)


def pooled_spread(table: dict[str, dict[int, float]]) -> Spread | None:
    """Least squares of the additive model ``log rate = contender + round`` over every launch (``table``: per
    contender, round index -> rate); None when the launches leave no degree of freedom.

    Why a model and not pairs alone: once some finalists rest, the leader's launches in rounds without them still
    say how fast the leader is (the round's shift comes from whoever ran in it), so a resting finalist's
    comparison keeps narrowing. Degrees of freedom: launches - contenders - rounds + 1 (the design is connected:
    the leader runs every round)."""
    cells = [(c, r, math.log(v)) for c, rates in table.items() for r, v in rates.items() if v > 0]
    names = sorted({c for c, _, _ in cells})
    rounds = sorted({r for _, r, _ in cells})
    df = len(cells) - len(names) - len(rounds) + 1
    if df < 1:
        return None
    column: dict[str | int, int] = {  # the design's column of each contender (by name) and round (by index)
        **{c: i for i, c in enumerate(names)},
        **{r: len(names) + k for k, r in enumerate(rounds)},
    }
    design = np.zeros((len(cells), len(names) + len(rounds)))
    for row, (contender, round_index, _) in enumerate(cells):
        design[row, column[contender]] = design[row, column[round_index]] = 1.0
    log_rates = np.array([v for _, _, v in cells])
    beta = np.linalg.lstsq(design, log_rates, rcond=None)[0]
    rss = float(np.sum((log_rates - design @ beta) ** 2))
    inverse = np.linalg.pinv(design.T @ design)
    contrast = {
        a: {b: float(inverse[i, i] + inverse[j, j] - 2 * inverse[i, j]) for j, b in enumerate(names)}
        for i, a in enumerate(names)
    }
    return Spread(math.sqrt(rss / df), df, {c: float(beta[i]) for i, c in enumerate(names)}, contrast)


@dataclass(frozen=True)
class Gap:
    """log(A/B): the estimate, the per-round spread of a paired ratio that bounds it, the rounds it is worth (paired
    rounds; with the race's model, the paired rounds of the same precision), its degrees of freedom, and the rounds
    both were launched in."""

    mean: float
    sd: float
    rounds: float
    df: int
    paired: int = -1  # rounds both were launched in (-1: ``rounds``)

    def half(self, alpha: float, rounds: float | None = None) -> float:
        """The one-sided ``1 - alpha`` half-width after ``rounds`` (default: those measured); infinite below
        ``MIN_ROUNDS`` paired rounds."""
        after = self.rounds if rounds is None else rounds
        if (self.paired if self.paired >= 0 else self.rounds) < MIN_ROUNDS or self.df < 1:
            return math.inf
        return t_quantile(1 - alpha, self.df) * self.sd / math.sqrt(after)

    def upper(self, alpha: float) -> float:
        """A may be at most this much faster than B (log), at ``1 - alpha``."""
        return self.mean + self.half(alpha)

    def lower(self, alpha: float) -> float:
        return self.mean - self.half(alpha)


def wider_than_chance(own: float, pooled: float, df: int, level: float | None = OWN_SPREAD_LEVEL) -> bool:
    """A pair's own spread (``df`` degrees of freedom) is wider than the pooled one by more than chance explains:
    (own / pooled)^2 above the chi-square's ``1 - level`` quantile over ``df`` (the F test against a pooled spread of
    many more degrees of freedom; at fewer, F's quantile is higher, so the pair's own is taken a little more
    often). ``level=None``: whenever it is wider (the rule before, ``benchmarks.previous_rules``).

    Why a test and not the larger of the two: on three paired rounds a pair's own spread has 2 degrees of freedom and
    comes out above the pooled one in about a third of the pairs of a race where every launch spreads alike, up to
    several times it; the larger of the two widened those bounds, and the loss bound the race states is the largest
    of them (docs/decisions.md#a-pairs-own-spread-when-shown-wider)."""
    if df < 1 or not own > pooled:
        return False
    if level is None or pooled <= 0:
        return True
    return (own / pooled) ** 2 > chi2_quantile(1 - level, df) / df


def gap(
    a: dict[int, float],
    b: dict[int, float],
    spread: Spread | None,
    names: tuple[str, str] = ("", ""),
    own_level: float | None = OWN_SPREAD_LEVEL,
) -> Gap:
    """A over B (round index -> rate). Without the race's model: the mean of the paired log ratios over their common
    rounds and their spread. With it (``names`` in ``spread.effects``): the difference of fitted rates, its
    precision from the design, and per launch the pooled spread, or the pair's own where it is wider by more than
    chance explains (``wider_than_chance`` at ``own_level``), at the pooled degrees of freedom (a noisier pair does
    not borrow a quieter race's spread)."""
    common = sorted(set(a) & set(b))
    logs = log_ratios([a[r] for r in common], [b[r] for r in common])
    if not logs:
        return Gap(0.0, math.inf, 0, 0)
    own = statistics.stdev(logs) if len(logs) > 1 else 0.0
    if spread is None:
        return Gap(statistics.fmean(logs), own, len(logs), len(logs) - 1)
    pooled = math.sqrt(2) * spread.sigma
    sd = own if wider_than_chance(own, pooled, len(logs) - 1, own_level) else pooled
    name_a, name_b = names
    if (
        name_a in spread.contrast
        and name_b in spread.contrast[name_a]
        and spread.contrast[name_a][name_b] > 0
    ):
        worth = 2 / spread.contrast[name_a][name_b]
        return Gap(spread.effects[name_a] - spread.effects[name_b], sd, worth, spread.df, len(logs))
    return Gap(statistics.fmean(logs), sd, len(logs), spread.df, len(logs))
