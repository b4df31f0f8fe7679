"""What the rounds so far show at one look: each contender's fitted rate, each pair's gap and bound, each loss
bound, and the error level every look is held to (multiple comparisons with the best)."""

from __future__ import annotations

import math
import statistics

from tuner import figure_text
from tuner.decisions import evidence
from tuner.decisions.evidence import DECISION_ROUNDS
from tuner.decisions.race.rounds import RaceRounds
from tuner.studyfile.spec import RaceSpec

DECISION_WIDTH = (
    0.15  # the widest bound (half-width, log) a close pair may decide on (PairedStatistics.decisive)
)
NORMAL = statistics.NormalDist()


CAP_SHARE = 0.5  # the share of the race's error level spent at the look at its cap (``race_alpha``)


def race_alpha(spec: RaceSpec, contenders: int, done: int | None = None) -> float:
    """The one-sided error of each comparison at the look after round ``done`` (None: a look before the cap):
    ``evidence.ALPHA`` over the comparisons with the (unknown) best finalist (contenders - 1, Bonferroni), and over
    the looks the race may take: ``CAP_SHARE`` of it at the look at race.max_rounds, the rest in equal shares over
    the looks before it (Bonferroni with unequal shares: they still sum to ``evidence.ALPHA``).

    Why the comparisons with the best only: if every bound on the best finalist holds at every look (probability
    >= 95%), a race that says one finalist is faster than every other is right, and every loss bound holds,
    whatever was selected, whichever finalists rested and whenever the race stopped (Hsu's multiple comparisons
    with the best). Why a larger share at the cap: a race that does not decide stops there and states its loss
    bound from that look (41-66% of the races at the default host, docs/decisions.md#the-cap-buys-its-bound),
    so spreading the level evenly over looks that rarely state one widened the bound a deployment carries."""
    comparisons = max(contenders - 1, 1)
    looks = spec.max_rounds - first_look(spec) + 1
    if looks == 1:
        return evidence.ALPHA / comparisons
    share = CAP_SHARE if done is not None and done >= spec.max_rounds else (1 - CAP_SHARE) / (looks - 1)
    return evidence.ALPHA * share / comparisons


def first_look(spec: RaceSpec) -> int:
    """The first round after which a race may decide or stop (its budget spent): ``DECISION_ROUNDS``, not before
    race.min_rounds, not after race.max_rounds."""
    return min(max(spec.min_rounds, evidence.MIN_ROUNDS, DECISION_ROUNDS), spec.max_rounds)


class PairedStatistics:
    """The paired statistics at one look: what the rounds so far show at the race's error level
    (``race_alpha``): the leader, each pair's gap, each loss bound. ``cap_alpha``: the level at the look at the
    race's cap, which every forecast of what the race will state or decide there uses (default: ``alpha``);
    ``own_level``: when a pair's own spread bounds its gap (``evidence.wider_than_chance``)."""

    def __init__(
        self,
        race_rounds: RaceRounds,
        alpha: float,
        cap_alpha: float | None = None,
        own_level: float | None = evidence.OWN_SPREAD_LEVEL,
    ):
        self.race_rounds = race_rounds
        self.alpha = alpha
        self.cap_alpha = alpha if cap_alpha is None else cap_alpha
        self.own_level = own_level
        self.table = race_rounds.table()
        self.spread = evidence.pooled_spread(self.table)
        self._gaps: dict[tuple[str, str], evidence.Gap] = {}

    def estimate(self, name: str) -> float:
        """A contender's fitted log rate (round shifts taken out), its log geometric mean before any fit."""
        if self.spread is not None and name in self.spread.effects:
            return self.spread.effects[name]
        mean = evidence.geometric_mean(self.race_rounds.rates[name])
        return math.log(mean) if mean > 0 else -math.inf

    @property
    def leader(self) -> str:
        return max(self.race_rounds.candidates, key=self.estimate)

    def gap(self, name: str, other: str) -> evidence.Gap:
        """log(name/other) on their common rounds."""
        if (other, name) in self._gaps:
            reverse = self._gaps[(other, name)]
            return evidence.Gap(
                mean=-reverse.mean, sd=reverse.sd, rounds=reverse.rounds, df=reverse.df, paired=reverse.paired
            )
        if (name, other) not in self._gaps:
            self._gaps[(name, other)] = evidence.gap(
                self.table[name], self.table[other], self.spread, (name, other), self.own_level
            )
        return self._gaps[(name, other)]

    def upper(self, name: str, other: str, share: float = 1.0) -> float:
        """``name`` may be at most this much faster than ``other`` (log), at ``share`` of the race's level."""
        return self.gap(name, other).upper(self.alpha * share)

    def worth_after(self, name: str, other: str, more: float, other_more: float) -> float:
        """The paired rounds the comparison of ``name`` with ``other`` is worth after ``more`` launches of ``name``
        and ``other_more`` of ``other``. A pair's worth read as two counts of launches (``other``'s, and the one
        that gives the pair its worth beside it), so that a rested finalist's comparison narrows both with its own
        launches and with those of the one it is compared with."""
        gap = self.gap(name, other)
        theirs = len(self.race_rounds.rates[other])
        if not gap.rounds > 0 or not theirs:
            return 0.0
        spare = 2 / gap.rounds - 1 / theirs
        own = 1 / spare if spare > 0 else math.inf
        return 2 / (1 / (own + more) + 1 / (theirs + other_more))

    def upper_after(self, name: str, other: str, more: float, other_more: float) -> float:
        """The bound of ``name`` over ``other`` (``upper``) forecast at the race's cap after ``more`` and
        ``other_more`` launches, at today's estimate and spread and the cap's level; infinite while the pair has no
        bound."""
        gap = self.gap(name, other)
        worth = self.worth_after(name, other, more, other_more)
        return gap.mean + gap.half(self.cap_alpha, worth) if worth > 0 else math.inf

    def loss(self, name: str) -> float:
        """The loss bound (log): how much faster than ``name`` the best other finalist still racing may be."""
        return max((self.upper(j, name) for j in self.race_rounds.candidates if j != name), default=-math.inf)

    def no_bound(self, name: str) -> str:
        """Why the loss bound of ``name`` is not a number, in words ("" when it is one): the finalists whose
        comparison with it has too few paired rounds (an outlier left out of a short race) or no spread yet."""
        why = []
        for other in self.race_rounds.candidates:
            if other == name or figure_text.finite(self.upper(other, name)):
                continue
            gap = self.gap(other, name)
            paired = round(gap.paired if gap.paired >= 0 else gap.rounds)
            why.append(
                f"{other} has {paired} kept round{'s' if paired != 1 else ''} beside {name} "
                f"({evidence.MIN_ROUNDS} needed)"
                if paired < evidence.MIN_ROUNDS
                else f"{other} has no spread yet beside {name}"
            )
        return "; ".join(why)

    def expected_loss(self, name: str, more_rounds: int = 0) -> float:
        """What deploying ``name`` is expected to lose (log): over the others, the normal loss function of each
        gap at its standard error, summed (EOC_Bonf, Branke, Chick and Schmidt 2007: a flat prior on each fitted
        rate). Small when every other is behind by several standard errors, so that further rounds would rarely
        change the pick; infinite while some comparison has no bound yet. With ``more_rounds``: after that many
        more rounds of every comparison, at today's estimates and spread (a forecast)."""
        total = 0.0
        for other in self.race_rounds.candidates:
            if other == name:
                continue
            gap = self.gap(other, name)
            if not math.isfinite(gap.half(self.alpha)) or gap.sd <= 0:
                return math.inf
            standard_error = gap.sd / math.sqrt(gap.rounds + more_rounds)
            standardized = gap.mean / standard_error
            total += standard_error * (NORMAL.pdf(standardized) + standardized * NORMAL.cdf(standardized))
        return total

    def replaces(self, name: str, baseline: str) -> bool:
        """``name`` may replace the baseline: shown faster than it (the whole two-sided simultaneous 95% interval
        of the speedup above 1)."""
        if name == baseline:
            return False
        return self.upper(baseline, name, 0.5) < 0

    def decisive(self, name: str, other: str) -> bool:
        """The bound of ``name`` over ``other`` may decide a race: wholly below ``-DECISION_WIDTH`` (``name`` far
        behind), or at most ``DECISION_WIDTH`` wide (half-width, log) on ``DECISION_ROUNDS`` paired rounds at
        least. A wider bound on a close pair is met by luck about as often as by a gap, so a race deciding on one
        would too often deploy the slower configuration."""
        gap = self.gap(name, other)
        half = gap.half(self.alpha)
        if gap.mean + half <= -DECISION_WIDTH:
            return True
        return half <= DECISION_WIDTH and (gap.paired if gap.paired >= 0 else gap.rounds) >= DECISION_ROUNDS

    def ratio(self, name: str, baseline: str) -> evidence.Ratio:
        """``name`` over the baseline on their common rounds, with the simultaneous two-sided 95% interval."""
        if name == baseline:
            return evidence.Ratio(estimate=1.0, low=1.0, high=1.0, rounds=len(self.race_rounds.rates[name]))
        gap = self.gap(name, baseline)
        half = gap.half(self.alpha / 2)
        return evidence.Ratio(
            estimate=math.exp(gap.mean),
            low=math.exp(gap.mean - half),
            high=math.exp(gap.mean + half),
            rounds=gap.paired,
        )
