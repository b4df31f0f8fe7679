"""The analytic model of speculative decoding, fitted to one or two measured trials per draft.

Why: on a big CPU box a trial costs minutes, and tokens/s against the draft length K is
a smooth, unimodal curve whose shape follows from two numbers. Leviathan et al. (2023):
if the target accepts each drafted token with probability ``a`` (independently), a round
that drafts K tokens yields ``(1 - a^(K+1)) / (1 - a)`` tokens, and costs K draft steps
plus one verification. With ``c`` the cost of a draft step relative to a target step,

    speedup(K) = (1 - a^(K+1)) / ((1 - a) (1 + c K))

Both numbers are observable in one trial: llama.cpp reports drafted and accepted tokens,
whose ratio is the *measured acceptance* ``a (1 - a^K) / ((1 - a) K)`` (K drafted per
round, the accepted prefix counted), which is inverted for ``a``; the speedup against
the target alone at the same hardware then gives ``c``. The best K is predicted before
it is measured. Real acceptance decays slowly with the draft position, so ``a`` fitted
at a small K is a little optimistic for a large one: with two measured K the fit
interpolates ``a`` in log K, which is why the sampler measures the predicted best K and
fits again rather than trusting one probe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

A_MAX = 0.9995  # acceptance probabilities are clamped below 1 (the formulas divide by 1 - a)


def expected_tokens(a: float, k: int) -> float:
    """Tokens one round yields: the accepted prefix of K drafts plus the target's own token."""
    if a >= A_MAX:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def measured_acceptance(a: float, k: int) -> float:
    """accepted / drafted as llama.cpp counts it, when each round drafts K tokens."""
    if k <= 0:
        return 0.0
    return (expected_tokens(a, k) - 1.0) / k


def acceptance_probability(rate: float, k: int) -> float:
    """Invert ``measured_acceptance``: the per-token probability behind a measured rate."""
    if k <= 1:
        return min(max(rate, 0.0), A_MAX)
    if rate <= 0.0:
        return 0.0
    lo, hi = 0.0, A_MAX
    if rate >= measured_acceptance(hi, k):
        return hi
    for _ in range(60):  # monotone in a: bisection
        mid = (lo + hi) / 2
        if measured_acceptance(mid, k) < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def speedup(a: float, c: float, k: int) -> float:
    """Tokens/s with speculation over tokens/s of the target alone, same hardware."""
    return expected_tokens(a, k) / (1.0 + c * k)


def cost_ratio(a: float, k: int, measured_speedup: float) -> float:
    """The draft/target cost ratio c that explains a measured speedup at acceptance a."""
    if measured_speedup <= 0 or k <= 0:
        return math.inf
    return max(0.0, (expected_tokens(a, k) / measured_speedup - 1.0) / k)


@dataclass(frozen=True)
class Point:
    """One measured trial of a draft: its K, measured acceptance, and speedup over the target alone."""

    k: int
    acceptance: float
    speedup: float | None  # None when no target-alone rate at the same hardware is known


@dataclass(frozen=True)
class DraftFit:
    """Acceptance and cost of one draft (or n-gram type) fitted to its measured points."""

    points: tuple[Point, ...]
    c: float

    def a_at(self, k: int) -> float:
        """Per-token acceptance at draft length k: interpolated (and extrapolated, gently) in log K."""
        pts = sorted({p.k: acceptance_probability(p.acceptance, p.k) for p in self.points}.items())
        if len(pts) == 1:
            return pts[0][1]
        (k0, a0), (k1, a1) = (pts[0], pts[-1]) if k <= pts[0][0] or k >= pts[-1][0] else _bracket(pts, k)
        if k0 == k1:
            return a0
        slope = (a1 - a0) / (math.log(k1) - math.log(k0))
        if k < pts[0][0] or k > pts[-1][0]:
            slope *= 0.5  # beyond the measured range trust the trend half as much
            k0, a0 = pts[0] if k < pts[0][0] else pts[-1]
        return min(max(a0 + slope * (math.log(k) - math.log(k0)), 0.0), A_MAX)

    def predict(self, k: int) -> float:
        return speedup(self.a_at(k), self.c, k)

    def best_k(self, ks: Iterable[int]) -> int:
        return max(ks, key=lambda k: (self.predict(k), -k))

    @property
    def a(self) -> float:
        """The per-token acceptance at the most recent (largest-K) point, for messages."""
        top = max(self.points, key=lambda p: p.k)
        return acceptance_probability(top.acceptance, top.k)

    def describe(self) -> str:
        pts = ", ".join(f"K={p.k}: {p.acceptance:.2f}" for p in sorted(self.points, key=lambda p: p.k))
        return f"acceptance {pts} -> a={self.a:.3f}, cost ratio {self.c:.3f}"


def _bracket(pts: Sequence[tuple[int, float]], k: int) -> tuple[tuple[int, float], tuple[int, float]]:
    for lo, hi in zip(pts, pts[1:]):
        if lo[0] <= k <= hi[0]:
            return lo, hi
    return pts[0], pts[-1]


def fit(points: Sequence[Point], default_c: float = 0.1) -> DraftFit | None:
    """Fit a draft from its points; c is the median over points that have a speedup.

    None without a point with acceptance > 0 (nothing to model: the draft never helps).
    """
    useful = [p for p in points if p.k > 0 and p.acceptance > 0]
    if not useful:
        return None
    cs = sorted(
        cost_ratio(acceptance_probability(p.acceptance, p.k), p.k, p.speedup) for p in useful if p.speedup
    )
    c = cs[len(cs) // 2] if cs else default_c
    return DraftFit(tuple(useful), c)
