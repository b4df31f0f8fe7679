"""The analytic model of speculative decoding, fitted to one or more measured trials per draft.

Why: on a big CPU box a trial costs minutes, and tokens/s against the draft length K is
a smooth, unimodal curve whose shape follows from a few numbers. Leviathan et al. (2023):
if the target accepts each drafted token with probability ``a`` (independently), a round
that drafts K tokens yields ``(1 - a^(K+1)) / (1 - a)`` tokens, and costs K draft steps
plus one verification. With ``c`` the cost of a drafted token relative to a target step,

    speedup(K) = (1 - a^(K+1)) / ((1 - a) (1 + c K))

Both numbers are observable in one trial: llama.cpp reports drafted and accepted tokens,
whose ratio is the *measured acceptance* ``a (1 - a^K) / ((1 - a) K)`` (K drafted per
round, the accepted prefix counted), which is inverted for ``a``; the speedup against
the target alone at the same hardware then gives ``c``. The best K is predicted before
it is measured. Real acceptance decays slowly with the draft position, so ``a`` fitted
at a small K is a little optimistic for a large one: with two measured K the fit
interpolates ``a`` in log K, which is why the sampler measures the predicted best K and
fits again rather than trusting one probe.

Two things llama.cpp does that Leviathan's round leaves out (evidence: docs/decisions.md, "The K model"):

- *A round has a fixed cost besides its K tokens* ``o``: the draft catching up on the tokens the round
  accepted, the target's verification batch beyond its own token, the server's sampling and bookkeeping.
  One point cannot tell it from ``c`` (it is taken as 0, Leviathan's round); measured at a small K it reads
  as a dearer token, and a walk that refits on its own smaller K then spirals down. From two K at least a
  factor 1.5 apart the round's cost ``o + c K`` is fitted as a line (Theil-Sen: the median slope and
  intercept), where both come out positive.
- *Not every step drafts*: an n-gram lookup drafts only where its key occurs earlier (``ngram-simple``: at
  most K tokens, no more than follow the match; ``ngram-mod``: until its hash table has no next token), and
  a draft model drafts less than K near a request's end. With the share ``q`` of the target's steps that
  verified a draft (drafted / (K x steps), from the trial's counts), a step drafts on ``q`` of them:

      speedup(K) = (1 + q (E(K) - 1)) / (1 + q (o + c K))

  so a lookup's modest speedup is read as few drafting steps, not as a dear token (which would forbid a
  long draft). Unknown ``q`` (no counts) is 1: Leviathan's round, every step drafting K.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

A_MAX = 0.9995  # acceptance probabilities are clamped below 1 (the formulas divide by 1 - a)
SLOPE_SPREAD = 1.5  # two K this far apart (a factor) tell a round's fixed cost from its per-token cost
# A draft is left unprobed only while a measured option beats its byte ceiling by this factor: the factor is
# for what its bytes do not say (a draft partly served from cache, a quant type cheaper to compute a byte).
UNPAYABLE_MARGIN = 2.0


def byte_ceiling(share: float) -> float:
    """The most speculation with a draft reading ``share`` of the target's weight bytes a token can speed
    decode by, on a host where both are memory-bound (each step reads its model's weights once): at any K,
    even with every draft accepted and verification free, a round gives K + 1 tokens for 1 + K ``share``
    target steps, which stays below ``1 / share`` (and below 1 for a draft as large as its target)."""
    return 1.0 / min(share, 1.0)


def draft_byte_shares(target: dict, drafts: dict[str, dict]) -> dict[str, float]:
    """Each dense draft's weight bytes over the target's, from a study record's ``ModelInfo`` dicts (draft name
    to share). A MoE draft reads only its routed experts a token, so its file says nothing of its cost: none;
    a MoE target reads fewer bytes than its weights, which only raises the ceiling. None without the bytes."""
    target_bytes = target.get("weights_bytes")
    if not target_bytes:
        return {}
    return {
        name: info["weights_bytes"] / target_bytes
        for name, info in drafts.items()
        if info.get("weights_bytes") and not info.get("expert_count")
    }


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


def drafting_share(drafted: float | None, steps: float | None, k: int) -> float | None:
    """The share ``q`` of the target's decode steps that verified a draft of K: drafted / (K x steps), at most 1.
    None where the counts are unknown (None or NaN) or nothing drafted."""
    if drafted is None or steps is None or not drafted > 0 or not steps > 0 or k <= 0:
        return None
    return min(float(drafted) / (k * float(steps)), 1.0)


def speedup(a: float, c: float, k: int, overhead: float = 0.0, share: float = 1.0) -> float:
    """Tokens/s with speculation over tokens/s of the target alone, same hardware: a share ``share`` of the
    target's steps verify a round of K drafts (costing ``overhead + c K`` more than a step), the rest decode
    one token alone."""
    return (1.0 + share * (expected_tokens(a, k) - 1.0)) / (1.0 + share * (overhead + c * k))


def cost_ratio(a: float, k: int, measured_speedup: float) -> float:
    """The draft/target cost ratio c that explains a measured speedup at acceptance a (every step drafting K,
    no fixed cost: Leviathan's round)."""
    if measured_speedup <= 0 or k <= 0:
        return math.inf
    return max(0.0, (expected_tokens(a, k) / measured_speedup - 1.0) / k)


@dataclass(frozen=True)
class Point:
    """One measured trial of a draft: its K, measured acceptance, speedup over the target alone and the share of
    the target's steps that drafted."""

    k: int
    acceptance: float
    speedup: float | None  # None when no target-alone rate at the same hardware is known
    share: float | None = None  # drafted / (K x the target's steps), in (0, 1]; None: unknown (taken as 1)

    @property
    def steps_drafting(self) -> float:
        return min(max(self.share, 1e-6), 1.0) if self.share is not None else 1.0

    def round_cost(self) -> float | None:
        """What a drafting round costs beyond a plain step (``o + c K``), in target steps, from this point's
        speedup; None without one."""
        if not self.speedup or self.speedup <= 0:
            return None
        q = self.steps_drafting
        return max(0.0, ((1.0 + q * self.acceptance * self.k) / self.speedup - 1.0) / q)


@dataclass(frozen=True)
class DraftFit:
    """Acceptance and cost of one draft (or n-gram type) fitted to its measured points."""

    points: tuple[Point, ...]
    c: float
    overhead: float = 0.0  # a drafting round's fixed cost ``o``, in target steps (0 from one point)

    def a_at(self, k: int) -> float:
        """Per-token acceptance at draft length k: interpolated (and extrapolated, gently) in log K."""
        pts = sorted({p.k: acceptance_probability(p.acceptance, p.k) for p in self.points}.items())
        return min(max(_in_log_k(pts, k), 0.0), A_MAX)

    def share_at(self, k: int) -> float:
        """The share of the target's steps that draft at length k, as ``a_at`` interpolates; 1 where no point
        knows it."""
        pts = sorted({p.k: p.steps_drafting for p in self.points if p.share is not None}.items())
        return min(max(_in_log_k(pts, k), 1e-6), 1.0) if pts else 1.0

    def predict(self, k: int) -> float:
        return speedup(self.a_at(k), self.c, k, self.overhead, self.share_at(k))

    def best_k(self, ks: Iterable[int]) -> int:
        return max(ks, key=lambda k: (self.predict(k), -k))

    @property
    def a(self) -> float:
        """The per-token acceptance at the most recent (largest-K) point, for messages."""
        top = max(self.points, key=lambda p: p.k)
        return acceptance_probability(top.acceptance, top.k)

    def describe(self) -> str:
        pts = ", ".join(f"K={p.k}: {p.acceptance:.2f}" for p in sorted(self.points, key=lambda p: p.k))
        fixed = f" + {self.overhead:.2f} a round" if self.overhead > 0 else ""
        top = max(self.points, key=lambda p: p.k)
        drafts = (
            f", drafting on {top.steps_drafting:.0%} of steps"
            if top.share is not None and top.share < 0.95
            else ""
        )
        return f"acceptance {pts} -> a={self.a:.3f}, cost ratio {self.c:.3f}{fixed}{drafts}"


def _in_log_k(pts: Sequence[tuple[int, float]], k: int) -> float:
    """A value known at some K (sorted), interpolated in log K between them; beyond them the nearest
    segment's trend at half its slope."""
    if len(pts) == 1:
        return pts[0][1]
    (k0, v0), (k1, v1) = (pts[0], pts[-1]) if k <= pts[0][0] or k >= pts[-1][0] else _bracket(pts, k)
    if k0 == k1:
        return v0
    slope = (v1 - v0) / (math.log(k1) - math.log(k0))
    if k < pts[0][0] or k > pts[-1][0]:
        slope *= 0.5  # beyond the measured range trust the trend half as much
        k0, v0 = pts[0] if k < pts[0][0] else pts[-1]
    return v0 + slope * (math.log(k) - math.log(k0))


def _bracket(pts: Sequence[tuple[int, float]], k: int) -> tuple[tuple[int, float], tuple[int, float]]:
    for lo, hi in zip(pts, pts[1:]):
        if lo[0] <= k <= hi[0]:
            return lo, hi
    return pts[0], pts[-1]


def round_cost_line(costs: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """(c, o): a round's cost ``o + c K`` through measured (K, cost) pairs, Theil-Sen (the median slope over
    pairs of K at least ``SLOPE_SPREAD`` apart, then the median intercept); None unless both are positive."""
    slopes = [
        (r1 - r0) / (k1 - k0)
        for i, (k0, r0) in enumerate(costs)
        for k1, r1 in costs[i + 1 :]
        if max(k0, k1) >= SLOPE_SPREAD * min(k0, k1)
    ]
    if not slopes:
        return None
    c = statistics.median(slopes)
    if c <= 0:
        return None
    overhead = statistics.median(r - c * k for k, r in costs)
    return (c, overhead) if overhead > 0 else None


def fit(points: Sequence[Point], default_c: float = 0.1) -> DraftFit | None:
    """Fit a draft from its points: from one K (or where the line does not fit) c is the median of the points'
    round costs per drafted token, without a fixed cost (Leviathan's round); from K far enough apart, the
    round's fixed and per-token cost as a line (``round_cost_line``).

    None without a point with acceptance > 0 (nothing to model: the draft never helps).
    """
    useful = [p for p in points if p.k > 0 and p.acceptance > 0]
    if not useful:
        return None
    costs = [(p.k, cost) for p in useful if (cost := p.round_cost()) is not None]
    line = round_cost_line(costs)
    if line is not None:
        return DraftFit(tuple(useful), line[0], line[1])
    cs = sorted(cost / k for k, cost in costs)
    c = cs[len(cs) // 2] if cs else default_c
    return DraftFit(tuple(useful), c)


def walk(
    measure: Callable[[int], Point | None], ks: Sequence[int], probe: int, steps: int
) -> DraftFit | None:
    """The structured search's best-K walk (``search.stages.best_k``) on a curve known in advance (a sweep, a
    test's model): the probe fitted, its predicted best K measured and fitted again, ``steps`` points at most;
    it stops where the pick is measured already or cannot be (``measure`` gives None). None without a probe or
    a fit."""
    first = measure(probe)
    if first is None:
        return None
    points = [first]
    for _ in range(steps - 1):
        model = fit(points)
        if model is None:
            return None
        k = model.best_k(ks)
        point = None if any(p.k == k for p in points) else measure(k)
        if point is None:
            break
        points.append(point)
    return fit(points)
