"""The finalist race: a sequential, launch-level race whose winner an operator can deploy.

Why: a study's best trial is the highest of many noisy single measurements (a configuration
that got lucky once), and every launch of a server runs a few percent faster or slower than
the last. An operator copies the winner to a fleet of fresh launches, so the race compares
launches, not requests, and says how sure it is.

1. **Finalists** (``finalists``): the leader on drift-corrected rates (tokens/s over the
   sentinel rate at the trial's time, ``tuner.decisions.drift``) and every trial within reach of
   it: the gap is below z x sqrt(cv_a^2 + cv_b^2 + 2 launch^2), the launch spread from the
   study's sentinels (``drift.Sentinels.launch_spread``: a conservative prior until three exist). One per
   configuration, the closest first, at most ``race.max_finalists``.
2. **Rounds** (``sequential_race``): the first ``race.min_rounds`` rounds launch every finalist and the
   baseline once each (``tuner.decisions.remeasure``, Williams order); later rounds launch the leader (the
   highest fitted log rate: ``evidence.pooled_spread`` takes out what a round did to everyone), the baseline
   while the leader is not shown faster than it, and the finalists whose bound against the leader sets its
   loss bound; the others rest (``_next_round``).
3. **The loss bound** (``Look.loss``): how much faster than a finalist the best other one may be, the largest
   one-sided upper bound of the paired per-round log ratios (``evidence.gap``: Student's t at the race's pooled
   degrees of freedom), each at ``race_alpha``: 5% over the comparisons with the unknown best and over the
   looks (Bonferroni), so the bound of whichever finalist is deployed holds with 95% whenever the race stops
   (multiple comparisons with the best).
4. **Decided** (``_decide``): from round ``DECISION_ROUNDS`` (5), once some finalist is within ``race.loss`` of
   every other (its loss bound below it, on bounds narrow enough to decide on: ``Look.decisive``) and may
   replace the baseline; the resource rule (fewer threads, then the smaller draft model; K is not a resource)
   chooses among those within it, and the baseline, llama.cpp's defaults, wins a tie. **Undecided** at
   ``race.max_rounds`` / ``race.budget_minutes`` (``_out_of_budget``), or from round 5 once no decision is
   forecast by race.max_rounds and deploying the leader is expected to lose less than ``race.expected_loss``
   (``_settled_enough``: more rounds would rarely change the pick): the highest estimate among the finalists shown
   faster than the baseline, else the baseline; the verdict says so, with the loss bound and a forecast of what
   settling would take (``Forecast``).
5. **The baseline is the default**: a finalist replaces it only when shown faster (the whole simultaneous 95%
   interval of its speedup above 1); the printed speedup is that interval, valid whichever finalist was picked.
   ``race.confirm_rounds`` (optional) adds rounds of the winner and the baseline alone for a figure from rounds
   not used to pick it.
6. **Outlier launches**: a launch far from the contender's other launches (``evidence.is_outlier``) is left out
   of the figures and reported, every launch judged again each round; the rounds go on by doubt (``_add_round``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import optuna

from tuner import eta, figures
from tuner.decisions import evidence, launch_size
from tuner.decisions.drift import Sentinels
from tuner.decisions.evidence import DECISION_ROUNDS
from tuner.decisions.remeasure import Launch, Remeasure, StudyInputs, contender
from tuner.errors import UserError
from tuner.measurement.measure import MeasurementSettings, prompt_rate
from tuner.measurement.workload import Workload
from tuner.storage import store
from tuner.storage.records import StudyRecord, TrialRecord
from tuner.studyfile.spec import RaceSpec

RESOURCE_RULE = (
    "among configurations within race.loss of every other finalist: fewer threads, then the smaller draft model "
    "(none is smallest)"
)
Z = 2.0
DECISION_WIDTH = 0.15  # the widest bound (half-width, log) a close pair may decide on (Look.decisive)
NORMAL = statistics.NormalDist()
RELAUNCHES = 3  # confirmation rounds: launches tried in place of an outlier (two in a row: 1 in 2,500 at 2%)
OUTLIER_CONTEXT = 2  # other launches a launch is compared with before it is judged an outlier (a finalist
# resting after race.min_rounds still has each of its launches checked)


def label(record: TrialRecord) -> str:
    return f"trial-{record.number}"


def users_text(n: int) -> str:
    return f"{n} user{'s' if n > 1 else ''}"


def race_title(users: int | None) -> str:
    """How a race's lines begin: ``race``, or ``race c4`` for a load class's (aggregate tokens/s at 4 users)."""
    return "race" if users is None else f"race c{users}"


def reach_z(trials: int) -> float:
    """How many spreads from the leader a trial may be and still be a finalist: the leader is the highest of
    ``trials`` single measurements, so the true best must be in reach of each of the others at once: z at 5% over
    them (Bonferroni), at least ``Z``. At 2.0 for 8 trials the best was left out 5% of the time at a 10% launch
    spread."""
    return max(Z, statistics.NormalDist().inv_cdf(1 - evidence.ALPHA / max(trials - 1, 1)))


def within_reach(scored: list[tuple[float, float]], launch: float) -> list[int]:
    """Indexes of (log rate, cv) pairs within reach of the best, closest first: the gap is below
    ``reach_z(n) * sqrt(cv_best^2 + cv^2 + 2 launch^2)`` (each was measured in one launch of its own)."""
    if not scored:
        return []
    order = sorted(range(len(scored)), key=lambda i: scored[i][0], reverse=True)
    top, top_cv = scored[order[0]]
    z = reach_z(len(scored))
    return [
        i for i in order if top - scored[i][0] <= z * math.sqrt(top_cv**2 + scored[i][1] ** 2 + 2 * launch**2)
    ]


def recorded_rate(record: TrialRecord, users: int | None = None) -> float:
    """What a trial recorded: one user's tokens/s, or with ``users`` the aggregate tokens/s at that level (0.0
    when it measured none)."""
    if users is None:
        return record.metrics.tokens_per_second if record.metrics else 0.0
    return record.level_figure("aggregate_tokens_per_second", users) or 0.0


def finalists(
    records: list[TrialRecord], noise_cv: float, max_finalists: int, users: int | None = None
) -> list[TrialRecord]:
    """The leader on drift-corrected rates and the feasible trials within reach of it, closest first,
    one per configuration (raw rates when a trial has no sentinel to divide by).

    With ``users``, a load class's finalists: on the aggregate tokens/s at that level, over the same sentinel
    rate (drift moves every level of a trial alike), each with the study's noise_cv (a level is one pass)."""
    sentinels = Sentinels(records, noise_cv)
    pool = [
        r
        for r in records
        if r.feasible
        and r.role != "sentinel"
        and r.metrics.tokens_per_second > 0
        and recorded_rate(r, users) > 0
    ]
    corrected = [1.0 if r.role == "baseline" else sentinels.speedup(r) for r in pool]
    rates = corrected if all(corrected) else [r.metrics.tokens_per_second for r in pool]
    scored = [
        (
            math.log(rate * recorded_rate(r, users) / r.metrics.tokens_per_second),
            r.spread.cv if users is None and r.spread and r.spread.cv is not None else noise_cv,
        )
        for rate, r in zip(rates, pool)
    ]
    chosen: dict = {}  # within reach of the leader, configurations that differ at most in prompt threads: one
    for i in within_reach(scored, sentinels.launch_spread()):  # finalist, the better prompt throughput
        chosen.setdefault(replace(pool[i].config, threads_batch=None), []).append(pool[i])
    return [prompt_pick(group) for group in chosen.values()][:max_finalists]


def prompt_pick(siblings: list[TrialRecord]) -> TrialRecord:
    """Of trials within reach of the leader whose configurations differ at most in ``threads_batch`` (the first:
    the closest to the leader), the one with the best prompt throughput, ties (``evidence.THREAD_TIE``) to fewer
    prompt threads: their decode is level within the noise, and prompt threads are tuned on prompts
    (``tuner.search.stages.prompt_threads``). The first where fewer than two measured prompts, or all share one
    prompt thread count."""
    rated = [(rate, r) for r in siblings if (rate := prompt_rate(r.samples))]
    if len({r.config.threads_batch for _, r in rated}) < 2:
        return siblings[0]
    top = max(rate for rate, _ in rated)
    tied = [r for rate, r in rated if rate >= (1 - evidence.THREAD_TIE) * top]
    return min(tied, key=lambda r: r.config.threads_batch or r.config.threads)


@dataclass
class Contest:
    """The evidence of a race so far: per label, one rate per round it was launched in, and those rounds."""

    rates: dict[str, list[float]]
    # every finalist and the baseline; one far behind rests, one that fails to launch twice leaves
    candidates: list[str]
    dropped: dict[str, str] = field(default_factory=dict)  # label -> shown slower than the winner, at the end
    outliers: list[str] = field(default_factory=list)  # each launch left out (or launched again) and why
    launches: int = 0
    vetted: set = field(default_factory=set)  # confirmation rounds: (label, index) checked for an outlier
    rounds: dict[str, list[int]] = field(default_factory=dict)  # per label, the round index of each rate
    # per label, every launch (round -> rate), and (label, round) -> why a launch is left out
    measured: dict[str, dict[int, float]] = field(default_factory=dict)
    left_out: dict[tuple[str, int], str] = field(default_factory=dict)
    elapsed: float = 0.0  # seconds since the first launch, after the last round

    def table(self) -> dict[str, dict[int, float]]:
        """Per label, round index -> rate."""
        return {n: dict(zip(self.rounds.get(n, range(len(v))), v)) for n, v in self.rates.items()}


@dataclass(frozen=True)
class Outcome:
    winner: str
    decided: bool
    verdict: str  # one sentence: how the winner was decided
    equivalent: list[str]  # within race.loss of every other finalist (the resource rule chose among them)
    leader: str  # the highest estimate
    loss: float = 0.0  # the winner may be at most this much slower than the best finalist (fraction, 95%)
    no_bound: str = ""  # why ``loss`` is not a number (infinite): Look.no_bound
    speedup: evidence.Ratio | None = None  # the winner over the baseline, simultaneous 95% interval
    forecast: str = ""  # what settling would take, when undecided
    speedups: dict = field(default_factory=dict)  # per label: its Ratio over the baseline


def _add_round(contest: Contest, launched: dict[str, float], round_index: int) -> None:
    """Record a round's launches, then judge again every launch of each contender launched: left out when far from
    all its other launches (those left out included), else kept; the figures use the kept ones.

    Why leave it out: a launch made again later is not in its round (the round's shift is not its own), and the
    race launches by doubt anyway: a contender left with too few rounds for a bound sets the loss bound and is
    launched in the next round (``_next_round``). Why judge again, against every launch: a contender whose first
    launches were slow (two outliers in three) would otherwise have each good launch judged against them and left
    out for the rest of the race (make bench 1c: the baseline deployed over a finalist 16x faster)."""
    contest.launches += len(launched)
    for name, value in launched.items():
        contest.measured.setdefault(name, {})[round_index] = value
    for name in launched:
        measured = contest.measured[name]
        kept: list[int] = []
        for at, value in measured.items():
            others = [v for r, v in measured.items() if r != at]
            judged = len(others) >= OUTLIER_CONTEXT or not value > 0
            if judged and evidence.is_outlier(value, others):
                contest.left_out[(name, at)] = (
                    f"round {at + 1}: {name} measured {value:.1f} t/s, far from its other rounds "
                    f"({_rates(others)}); left out"
                )
            else:
                contest.left_out.pop((name, at), None)
                kept.append(at)
        contest.rates[name] = [measured[at] for at in kept]
        contest.rounds[name] = kept
    contest.outliers = [contest.left_out[k] for k in sorted(contest.left_out, key=lambda k: (k[1], k[0]))]


def _add_confirmation_round(
    contest: Contest, launched: dict[str, float], relaunch: Callable[[str], float]
) -> None:
    """Append a confirmation round's rates; a launch far from its contender's other launches is launched again
    until it is not or ``RELAUNCHES`` launches were tried (a fixed pair of lists: nothing else would fill it).
    Every launch is checked as soon as its contender has ``OUTLIER_CONTEXT`` other launches (the first ones later,
    retroactively), and no launch is checked twice."""
    contest.launches += len(launched)
    for name, value in launched.items():
        contest.rates[name].append(value)
    for name in launched:
        rates = contest.rates[name]
        for i, value in enumerate(rates):
            if (name, i) in contest.vetted or (len(rates) - 1 < OUTLIER_CONTEXT and value > 0):
                continue
            contest.vetted.add((name, i))
            others = rates[:i] + rates[i + 1 :]
            if not evidence.is_outlier(value, others):
                continue
            tried = []
            while len(tried) < RELAUNCHES and (not tried or evidence.is_outlier(tried[-1], others)):
                tried.append(relaunch(name))
            contest.launches += len(tried)
            rates[i] = tried[-1]
            contest.outliers.append(
                f"round {i + 1}: {name} measured {value:.1f} t/s, far from its other rounds ({_rates(others)}); "
                f"launched again: {_rates(tried)} t/s (the last used)"
            )


def _rates(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def race_alpha(spec: RaceSpec, contenders: int) -> float:
    """The one-sided error of each comparison at each look: ``evidence.ALPHA`` over the comparisons with the
    (unknown) best finalist (contenders - 1) and over the looks the race may take (Bonferroni, both).

    Why the comparisons with the best only: if every bound on the best finalist holds at every look (probability
    >= 95%), a race that says one finalist is faster than every other is right, and every loss bound holds,
    whatever was selected, whichever finalists rested and whenever the race stopped (Hsu's multiple comparisons
    with the best)."""
    looks = spec.max_rounds - first_look(spec) + 1
    return evidence.ALPHA / (max(contenders - 1, 1) * looks)


def first_look(spec: RaceSpec) -> int:
    """The first round after which a race may decide or stop (its budget spent): ``DECISION_ROUNDS``, not before
    race.min_rounds, not after race.max_rounds."""
    return min(max(spec.min_rounds, evidence.MIN_ROUNDS, DECISION_ROUNDS), spec.max_rounds)


class Look:
    """What the rounds so far show at the race's error level (``race_alpha``): the leader, each pair's gap, each
    loss bound."""

    def __init__(self, contest: Contest, alpha: float):
        self.contest = contest
        self.alpha = alpha
        self.table = contest.table()
        self.spread = evidence.pooled_spread(self.table)
        self._gaps: dict[tuple[str, str], evidence.Gap] = {}

    def estimate(self, name: str) -> float:
        """A contender's fitted log rate (round shifts taken out), its log geometric mean before any fit."""
        if self.spread is not None and name in self.spread.effects:
            return self.spread.effects[name]
        mean = evidence.geometric_mean(self.contest.rates[name])
        return math.log(mean) if mean > 0 else -math.inf

    @property
    def leader(self) -> str:
        return max(self.contest.candidates, key=self.estimate)

    def gap(self, a: str, b: str) -> evidence.Gap:
        """log(a/b) on their common rounds."""
        if (b, a) in self._gaps:
            g = self._gaps[(b, a)]
            return evidence.Gap(-g.mean, g.sd, g.rounds, g.df, g.paired)
        if (a, b) not in self._gaps:
            self._gaps[(a, b)] = evidence.gap(self.table[a], self.table[b], self.spread, (a, b))
        return self._gaps[(a, b)]

    def upper(self, a: str, b: str, share: float = 1.0) -> float:
        """``a`` may be at most this much faster than ``b`` (log), at ``share`` of the race's level."""
        return self.gap(a, b).upper(self.alpha * share)

    def loss(self, name: str) -> float:
        """The loss bound (log): how much faster than ``name`` the best other finalist still racing may be."""
        return max((self.upper(j, name) for j in self.contest.candidates if j != name), default=-math.inf)

    def no_bound(self, name: str) -> str:
        """Why the loss bound of ``name`` is not a number, in words ("" when it is one): the finalists whose
        comparison with it has too few paired rounds (an outlier left out of a short race) or no spread yet."""
        why = []
        for j in self.contest.candidates:
            if j == name or figures.finite(self.upper(j, name)):
                continue
            g = self.gap(j, name)
            paired = round(g.paired if g.paired >= 0 else g.rounds)
            why.append(
                f"{j} has {paired} kept round{'s' if paired != 1 else ''} beside {name} ({evidence.MIN_ROUNDS} needed)"
                if paired < evidence.MIN_ROUNDS
                else f"{j} has no spread yet beside {name}"
            )
        return "; ".join(why)

    def expected_loss(self, name: str) -> float:
        """What deploying ``name`` is expected to lose (log): over the others, the normal loss function of each
        gap at its standard error, summed (EOC_Bonf, Branke, Chick and Schmidt 2007: a flat prior on each fitted
        rate). Small when every other is behind by several standard errors, so that further rounds would rarely
        change the pick; infinite while some comparison has no bound yet."""
        total = 0.0
        for j in self.contest.candidates:
            if j == name:
                continue
            g = self.gap(j, name)
            if not math.isfinite(g.half(self.alpha)) or g.sd <= 0:
                return math.inf
            se = g.sd / math.sqrt(g.rounds)
            z = g.mean / se
            total += se * (NORMAL.pdf(z) + z * NORMAL.cdf(z))
        return total

    def replaces(self, name: str, baseline: str) -> bool:
        """``name`` may replace the baseline: shown faster than it (the whole two-sided simultaneous 95% interval
        of the speedup above 1)."""
        if name == baseline:
            return False
        return self.upper(baseline, name, 0.5) < 0

    def decisive(self, a: str, b: str) -> bool:
        """The bound of ``a`` over ``b`` may decide a race: wholly below ``-DECISION_WIDTH`` (``a`` far behind), or
        at most ``DECISION_WIDTH`` wide (half-width, log) on ``DECISION_ROUNDS`` paired rounds at least. A wider
        bound on a close pair is met by luck about as often as by a gap: at 10% launch and 10% round spread and a
        3% gap, 3 of the 12 races (of 1,000) that decided without this deployed the slower configuration."""
        g = self.gap(a, b)
        half = g.half(self.alpha)
        if g.mean + half <= -DECISION_WIDTH:
            return True
        return half <= DECISION_WIDTH and (g.paired if g.paired >= 0 else g.rounds) >= DECISION_ROUNDS

    def ratio(self, name: str, baseline: str) -> evidence.Ratio:
        """``name`` over the baseline on their common rounds, with the simultaneous two-sided 95% interval."""
        if name == baseline:
            return evidence.Ratio(1.0, 1.0, 1.0, len(self.contest.rates[name]))
        g = self.gap(name, baseline)
        half = g.half(self.alpha / 2)
        return evidence.Ratio(math.exp(g.mean), math.exp(g.mean - half), math.exp(g.mean + half), g.paired)


def _percent(log_bound: float) -> str:
    return figures.percent_up(math.expm1(log_bound))


def loss_text(fraction: float) -> str:
    """A loss the operator set, as written: 2%, 0.5% (never rounded to 0%)."""
    return f"{100 * fraction:.3g}%"


def _decide(
    contest: Contest, look: Look, baseline: str, resources: dict[str, tuple], spec: RaceSpec, rounds: int
) -> Outcome | None:
    """An outcome once some finalist is within ``race.loss`` of every other (its loss bound below it, on decisive
    bounds) and may replace the baseline; the resource rule chooses among those within it, and the baseline, the
    default, wins a tie."""
    margin = math.log1p(spec.loss)
    everyone = contest.candidates

    def settled(c: str) -> bool:
        return all(look.upper(j, c) <= margin and look.decisive(j, c) for j in everyone if j != c)

    within = [c for c in everyone if settled(c)]
    if baseline in within:
        return _outcome(
            look, baseline, True, [c for c in within if c != baseline], baseline, spec, rounds, ""
        )
    replacing = [c for c in within if look.replaces(c, baseline) and look.decisive(baseline, c)]
    if not replacing:
        return None
    winner = min(replacing, key=lambda c: (resources.get(c, ()), -look.estimate(c)))
    return _outcome(look, winner, True, [c for c in within if c != winner], baseline, spec, rounds, "")


def _outcome(
    look: Look,
    winner: str,
    decided: bool,
    within: list[str],
    baseline: str,
    spec: RaceSpec,
    rounds: int,
    limit: str,
) -> Outcome:
    loss = look.loss(winner)
    leader = look.leader
    speedups = {n: look.ratio(n, baseline) for n in look.contest.rates}
    for j in look.contest.candidates:
        if j != winner and look.upper(j, winner) < 0:
            look.contest.dropped[j] = f"shown slower than {winner} after {rounds} rounds"
    margin = math.log1p(spec.loss)
    open_ = [j for j in look.contest.candidates if j != winner and look.upper(j, winner) > margin]
    best = (
        leader
        if leader != baseline
        else max((n for n in look.contest.candidates if n != baseline), key=look.estimate)
    )
    if decided:
        verdict = _decided_verdict(look, winner, within, baseline, spec, rounds, leader)
    elif winner == baseline:
        verdict = (
            f"nothing was shown faster than the baseline after {rounds} rounds ({limit}): the baseline "
            f"is deployed; {best} has the highest estimate ({speedups[best].text()} over it)"
        )
    else:
        verdict = (
            f"undecided after {rounds} rounds ({limit}): {winner} has the highest estimate"
            + (" shown faster than the baseline" if winner != leader else "")
            + " and is deployed; "
            + (
                f"not told apart from {', '.join(open_)}"
                if open_
                else f"every other finalist is within race.loss ({loss_text(spec.loss)}) of it, on bounds too few rounds "
                f"({DECISION_ROUNDS} paired) or too wide to decide on"
            )
        )
    forecast = "" if decided or not open_ else _forecast_after(look, winner, open_, spec)
    return Outcome(
        winner=winner,
        decided=decided,
        verdict=verdict,
        equivalent=within,
        leader=leader,
        loss=max(math.expm1(loss), 0.0),
        no_bound=look.no_bound(winner),
        speedup=speedups[winner],
        forecast=forecast,
        speedups=speedups,
    )


def _decided_verdict(
    look: Look, winner: str, within: list[str], baseline: str, spec: RaceSpec, rounds: int, leader: str
) -> str:
    loss = look.loss(winner)
    if loss < 0:
        return f"{winner} shown faster than every other finalist after {rounds} rounds"
    if winner == baseline:
        return (
            f"nothing was shown faster than the baseline after {rounds} rounds: no finalist is more than "
            f"{_percent(loss)} faster than it (95%), within race.loss ({loss_text(spec.loss)})"
        )
    verdict = (
        f"{winner} is within race.loss ({loss_text(spec.loss)}) of every other finalist after {rounds} rounds: "
        f"none is more than {_percent(loss)} faster (95%)"
    )
    if within:
        verdict += (
            f"; deployed by the resource rule ({RESOURCE_RULE}) among {', '.join([winner, *within])}"
            + (f" ({leader} has the highest estimate)" if leader != winner else "")
        )
    return verdict


def _undecided(
    contest: Contest, look: Look, baseline: str, spec: RaceSpec, limit: str, rounds: int
) -> Outcome:
    """Out of rounds or time: the highest estimate among the finalists shown faster than the baseline (the leader
    when it is one), else the baseline."""
    leader = look.leader
    shown = [c for c in contest.candidates if look.replaces(c, baseline)]
    winner = (
        baseline
        if leader == baseline or not shown
        else leader
        if leader in shown
        else max(shown, key=look.estimate)
    )
    return _outcome(look, winner, False, [], baseline, spec, rounds, limit)


def _settled_enough(
    contest: Contest, look: Look, baseline: str, spec: RaceSpec, rounds: int
) -> Outcome | None:
    """An undecided outcome before the last round, when no decision is forecast by race.max_rounds, the leader
    would be deployed (the baseline, or shown faster than it) and deploying it is expected to lose less than
    ``race.expected_loss`` (``Look.expected_loss``): further rounds would rarely change the pick, though its loss
    bound (95%) may still be wide. Why: at the default host a race rarely gets every bound within race.loss by its
    last round, and those rounds cost more than the pick they could change (make bench 1c: the previous rules'
    error at 1.55x fewer launches)."""
    leader = look.leader
    if not spec.expected_loss or rounds >= spec.max_rounds or _in_reach(look, spec, rounds):
        return None
    if leader != baseline and not look.replaces(leader, baseline):
        return None  # the baseline would be deployed, and more rounds may show the leader faster than it
    expected = look.expected_loss(leader)
    if expected >= math.log1p(spec.expected_loss):
        return None
    shown = f"{math.expm1(expected):.2%}" if expected >= 0.0001 else "under 0.01%"
    why = (
        f"expected loss {shown}, below race.expected_loss ({loss_text(spec.expected_loss)}): "
        "more rounds would rarely change the pick"
    )
    return _undecided(contest, look, baseline, spec, why, rounds)


def _out_of_budget(
    contest: Contest, look: Look, baseline: str, spec: RaceSpec, rounds: int, late: bool
) -> Outcome | None:
    """An undecided outcome at race.max_rounds, or once race.budget_minutes is spent (``late``)."""
    if rounds >= spec.max_rounds:
        limit = f"race.max_rounds ({spec.max_rounds}) reached"
    elif late:
        limit = f"the time budget ({spec.budget_minutes} min) reached"
    else:
        return None
    return _undecided(contest, look, baseline, spec, limit, rounds)


# ------------------------------------------------------------------ forecasts


@dataclass(frozen=True)
class Forecast:
    """What telling ``margin`` apart would take at a per-round spread: more paired rounds, and minutes; after a
    race, the rival it is about, where its estimate stands, and the rounds if the two were level."""

    margin: float  # fraction
    spread: float  # sd of one round's log ratio
    rounds: float  # infinite: the spread is not known yet
    minutes: float | None
    more: bool = True  # rounds on top of those raced (after a race), or in all (before one)
    source: str = ""  # where the spread comes from, when not from the race
    rival: str = ""
    behind: float = 0.0  # the rival's estimate below the deployed one (fraction; negative: ahead)
    level_rounds: float | None = None

    def text(self) -> str:
        if not (figures.finite(self.rounds) and figures.finite(self.spread)):
            return (
                f"to tell {loss_text(self.margin)} apart: no forecast yet (the per-round spread is not known)"
            )
        time_ = (
            ""
            if not figures.finite(self.minutes)
            else " (under a minute)"
            if self.minutes < 0.5
            else f" (about {self.minutes:.0f} min)"
        )
        where = ""
        if self.rival:
            side = f"{self.behind:.1%} behind" if self.behind >= 0 else f"{-self.behind:.1%} ahead"
            where = f", with {self.rival} {side} as estimated" + (
                f"; about {figures.figure(self.level_rounds, '.0f')} if the two are level"
                if self.level_rounds
                else ""
            )
        return (
            f"to tell {loss_text(self.margin)} apart at this host's {self.spread:.1%} per-round spread{self.source}: "
            f"about {self.rounds:.0f}{' more' if self.more else ''} round{'s' if self.rounds != 1 else ''}{time_}"
            f"{where}"
        )


def rounds_to_tell(sd: float, margin: float, mean: float, t: float) -> float:
    """Paired rounds for a bound on log(other/deployed) estimated at ``mean`` to settle: below ``margin`` (the
    other is within it) or, if the other is ahead, the other shown faster; the nearer of the two. Infinite
    where the spread is not known (``Forecast`` then says so)."""
    room = max(margin - mean, mean, margin / 2)
    rounds = (t * sd / room) ** 2 if room > 0 else math.inf
    return float(math.ceil(rounds)) if figures.finite(rounds) else math.inf


def _forecast_after(look: Look, winner: str, open_: list[str], spec: RaceSpec) -> str:
    """The rounds the deployed and its most open rival would need, at the race's own spread and error level."""
    rival = max(open_, key=lambda j: look.upper(j, winner))
    g = look.gap(rival, winner)
    if not math.isfinite(g.sd) or g.df < 1:
        return ""
    t, margin = evidence.t_quantile(1 - look.alpha, g.df), math.log1p(spec.loss)
    more = max(rounds_to_tell(g.sd, margin, g.mean, t) - math.floor(g.rounds), 1.0)
    level = max(rounds_to_tell(g.sd, margin, 0.0, t) - math.floor(g.rounds), 1.0)
    per_launch = look.contest.elapsed / look.contest.launches if look.contest.launches else 0.0
    minutes = 2 * more * per_launch / 60 if per_launch > 0.5 else None
    behind = -math.expm1(g.mean)
    return Forecast(
        spec.loss,
        g.sd,
        more,
        minutes,
        rival=rival,
        behind=behind,
        level_rounds=level if level != more else None,
    ).text()


def forecast_before(
    launch_sigma: float, contenders: int, spec: RaceSpec, seconds_per_launch: float | None
) -> Forecast:
    """Before racing: two equal finalists, each launch spread ``launch_sigma`` (the study's sentinels), at the
    race's error level with the degrees of freedom a full race would have."""
    sd = math.sqrt(2) * launch_sigma
    df = max((contenders - 1) * (spec.max_rounds - 1), 1)
    t = evidence.t_quantile(1 - race_alpha(spec, contenders), df)
    rounds = rounds_to_tell(sd, math.log1p(spec.loss), 0.0, t)
    minutes = 2 * rounds * seconds_per_launch / 60 if seconds_per_launch else None
    return Forecast(spec.loss, sd, rounds, minutes, more=False, source=" (the study's sentinels)")


# ------------------------------------------------------------------ the race


def _final(look: Look, j: str, leader: str, left: int) -> float:
    """The bound of ``j`` over the leader forecast for ``left`` more rounds of both, at today's estimate and spread."""
    g = look.gap(j, leader)
    return g.mean + g.half(look.alpha, g.rounds + left)


def _pooled_upper(look: Look, j: str, leader: str) -> float:
    """The bound of ``j`` over the leader at the race's pooled spread: which comparison sets the loss bound, without
    a pair's own spread of a few rounds deciding where the next launch goes."""
    g = look.gap(j, leader)
    if look.spread is None:
        return g.upper(look.alpha)
    return g.mean + evidence.Gap(g.mean, math.sqrt(2) * look.spread.sigma, g.rounds, g.df, g.paired).half(
        look.alpha
    )


def _in_reach(look: Look, spec: RaceSpec, done: int) -> bool:
    """A decision is forecast by race.max_rounds: every bound over the leader below race.loss then, at today's
    estimates and spread."""
    leader = look.leader
    others = [j for j in look.contest.candidates if j != leader]
    return bool(others) and max(
        _final(look, j, leader, spec.max_rounds - done) for j in others
    ) <= math.log1p(spec.loss)


def _next_round(contest: Contest, look: Look | None, baseline: str, spec: RaceSpec, done: int) -> list[str]:
    """Who is launched next: every finalist for the first ``race.min_rounds`` rounds; then the leader, the
    runner-up (which of the two is the best is the pick), the finalist whose bound against the leader is the
    largest (it sets the loss bound the race reports), and the baseline while the leader is not shown faster
    than it. The others rest; their comparisons keep narrowing as the leader's launches accumulate (the race's
    model carries them through the rounds' shifts), and one rejoins when its bound becomes the largest. When the
    forecast says a decision is in reach by ``race.max_rounds``, the finalists whose bound is too wide to decide
    on are launched too. A finalist with an outlier left out of its first rounds has no bound (fewer than
    ``evidence.MIN_ROUNDS`` paired rounds), so it sets the loss bound and is launched next. Why not KN
    or OCBA: both spread launches to pick the best behind an indifference zone; the race's answer is a pick and a
    loss bound, and each round goes to the comparisons that set them."""
    live = contest.candidates
    if look is None or done < max(spec.min_rounds, evidence.MIN_ROUNDS):
        return list(live)
    leader = look.leader
    others = [j for j in live if j != leader]
    chosen = {leader}
    if others:
        chosen.add(max(others, key=look.estimate))
        chosen.add(max(others, key=lambda j: _pooled_upper(look, j, leader)))
        if _in_reach(look, spec, done):
            chosen |= {j for j in others if not look.decisive(j, leader)}
    if baseline in live and not look.replaces(leader, baseline):
        chosen.add(baseline)
    return [n for n in live if n in chosen]


def _round_line(
    contest: Contest, look: Look, measured: list[str], r: int, outcome: Outcome | None, title: str = "race"
) -> str:
    resting = [n for n in contest.candidates if n not in measured]

    def rate(n: str) -> str:
        return f"{contest.rates[n][-1]:.1f}" if contest.rounds[n][-1:] == [r] else "left out (outlier)"

    leader = look.leader
    status = (
        outcome.verdict
        if outcome
        else f"racing on ({leader} leads; no other finalist more than {_percent(max(look.loss(leader), 0.0))} "
        f"faster, 95%)"
        if math.isfinite(look.loss(leader))
        else "racing on"
    )
    return (
        f"{title} round {r + 1}: "
        + ", ".join(f"{n} {rate(n)}" for n in measured)
        + " t/s"
        + (f" (resting: {', '.join(resting)})" if resting else "")
        + f"; {status}"
    )


def _leave_failed(
    contest: Contest, chosen: list[str], launched: dict[str, float], baseline: str, title: str, r: int
) -> list[str]:
    """Who was launched this round. A finalist whose launch failed twice leaves the race (its launches so far stay
    in the table), so the others' rounds are not lost with it; without the baseline nothing can be shown faster,
    and without a finalist there is nothing to race: either ends the race with the failure."""
    for name in [n for n in chosen if n not in launched]:
        if name == baseline:
            raise UserError(
                f"{title}: the baseline ({name}) failed to launch twice in round {r + 1}, and without it nothing "
                "can be shown faster (the reason is on the line above)"
            )
        contest.candidates.remove(name)
        contest.dropped[name] = f"failed to launch twice in round {r + 1}"
    if len(contest.candidates) < 2:
        raise UserError(
            f"{title}: every finalist failed to launch twice (the reasons are on the lines above)"
        )
    return [n for n in chosen if n in launched]


def sequential_race(
    labels: list[str],
    baseline: str,
    launch_round: Callable[[list[str], int], dict[str, float]],
    resources: dict[str, tuple],
    spec: RaceSpec,
    progress: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    title: str = "race",
) -> tuple[Contest, Outcome]:
    """Rounds of launches until some finalist is within ``race.loss`` of every other and may replace the baseline.

    ``launch_round(labels, round_index)`` launches each once and returns its rate; ``resources[label]`` orders
    equals (smaller first). Pure apart from that call, so ``make bench`` runs this same code on a simulated
    host."""
    everyone = list(dict.fromkeys([*labels, baseline]))
    contest = Contest({n: [] for n in everyone}, list(everyone), rounds={n: [] for n in everyone})
    first = first_look(spec)
    alpha = race_alpha(spec, len(everyone))
    started = clock()
    deadline = started + 60 * spec.budget_minutes if spec.budget_minutes else math.inf
    look = None
    for r in range(spec.max_rounds):
        chosen = _next_round(contest, look, baseline, spec, r)
        launched = launch_round(chosen, r)
        measured = _leave_failed(contest, chosen, launched, baseline, title, r)
        _add_round(contest, launched, r)
        contest.elapsed = clock() - started
        look = Look(contest, alpha)
        outcome = None
        if r + 1 >= first:
            outcome = (
                _decide(contest, look, baseline, resources, spec, r + 1)
                or _settled_enough(contest, look, baseline, spec, r + 1)
                or _out_of_budget(contest, look, baseline, spec, r + 1, clock() >= deadline)
            )
        eta.expect(progress, 0 if outcome else (spec.max_rounds - r - 1) * len(measured))
        progress(_round_line(contest, look, measured, r, outcome, title))
        if outcome is not None:
            return contest, outcome
    raise AssertionError("a race's last round always ends it (first_look is at most race.max_rounds)")


@dataclass(frozen=True)
class Entry:
    trial: int
    label: str
    config: dict
    recorded_tokens_per_second: float
    rates: list[float]  # one launch per round it was launched in
    mean_tokens_per_second: float  # geometric mean over those launches
    speedup: float  # geometric mean of paired per-round ratios over the baseline
    speedup_low: float  # simultaneous 95% interval (over the finalists and the race's looks)
    speedup_high: float
    status: str  # winner, within race.loss, leader, dropped: why, undecided
    accepted: list[int] = field(default_factory=list)  # accepted draft tokens per launch
    rounds: list[int] = field(default_factory=list)  # the round (from 1) of each launch


@dataclass(frozen=True)
class Confirmation:
    """The winner and the baseline launched alone in further rounds (``race.confirm_rounds``)."""

    rounds: int
    winner_rates: list[float]
    baseline_rates: list[float]
    speedup: float
    low: float
    high: float

    def text(self) -> str:
        return evidence.Ratio(self.speedup, self.low, self.high, self.rounds).text()


@dataclass(frozen=True)
class RaceResult:
    rounds: int  # selection rounds
    baseline_trial: int
    entries: list[Entry]  # best estimate first
    winner: int  # trial number: the deployed configuration (the baseline when nothing was shown faster)
    decided: bool
    verdict: str
    rule: str
    loss: float  # race.loss: a finalist within this of every other is deployed by the resource rule
    drafted: dict[
        str, int
    ]  # per label, tokens drafted during the race (0 for a speculative one: it did not draft)
    outliers: list[str]
    launches: int
    confirmation: Confirmation | None  # with race.confirm_rounds, when a finalist replaced the baseline
    # the best other finalist may be at most this much faster (95%); 0: none is; None: no bound (``no_bound`` says
    # why, or a race stored by an older version)
    loss_bound: float | None = None
    leader: int | None = None  # the highest estimate (the best candidate when the baseline is deployed)
    forecast: str = ""  # after an undecided race: what telling race.loss apart would take
    users: int | None = None  # a load class's race: aggregate tokens/s at this many users at once
    no_bound: str = (
        ""  # why there is no loss bound yet: a finalist with too few kept rounds beside the deployed
    )

    @property
    def title(self) -> str:
        return race_title(self.users)

    @property
    def winning(self) -> Entry:
        return next(e for e in self.entries if e.trial == self.winner)

    @property
    def baseline_deployed(self) -> bool:
        return self.winner == self.baseline_trial

    @property
    def best_candidate(self) -> Entry | None:
        """The highest estimate other than the baseline: its figures go beside a deployed baseline."""
        others = [e for e in self.entries if e.trial != self.baseline_trial]
        leader = next((e for e in others if e.trial == self.leader), None)
        return leader or max(others, key=lambda e: e.speedup, default=None)

    def speedup_of(self, entry: Entry) -> evidence.Ratio:
        """An entry over the baseline on their paired rounds, with its simultaneous 95% interval."""
        return evidence.Ratio(
            entry.speedup, entry.speedup_low, entry.speedup_high, _paired_with_baseline(self, entry)
        )

    def figure(self) -> str:
        """The winner's speedup and where it comes from."""
        if self.baseline_deployed:
            return "x1.00: the baseline configuration is deployed (nothing was shown faster than it)"
        if self.confirmation is not None:
            c = self.confirmation
            return (
                f"{c.text()} over the baseline, from {c.rounds} confirmation rounds (winner and baseline "
                f"launched alone, not used to pick it)"
            )
        return (
            f"{self.speedup_of(self.winning).text()} over the baseline on the race's paired rounds (a 95% interval simultaneous over "
            f"the finalists, so picking the winner does not void it)"
        )

    def loss_line(self) -> str:
        """What the deployment may lose: ``deployed trial 2; no other finalist is more than 6.1% faster (95%, 8 rounds)``."""
        deployed = "deployed the baseline, trial" if self.baseline_deployed else "deployed trial"
        rounds = len(self.winning.rates)
        if self.no_bound:
            return f"{deployed} {self.winner}; no bound yet: {self.no_bound}"
        if self.loss_bound is None:
            return f"{deployed} {self.winner}; no loss bound (a race stored by an older version)"
        if self.loss_bound <= 0:
            return f"{deployed} {self.winner}; no other finalist is faster (95%, {rounds} rounds)"
        return (
            f"{deployed} {self.winner}; no other finalist is more than {figures.percent_up(self.loss_bound)} "
            f"faster (95%, {rounds} rounds)"
        )

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RaceResult | None:
        """None for a race stored by an older version (one launch per contender, no verdict)."""
        if "verdict" not in data:
            return None
        data = dict(data)
        if "equivalence" in data:  # before race.loss (issue 31): a TOST margin
            data["loss"] = data.pop("equivalence")
        confirmation = Confirmation(**data["confirmation"]) if data.get("confirmation") else None
        return cls(**{**data, "entries": [Entry(**e) for e in data["entries"]], "confirmation": confirmation})


def _paired_with_baseline(result: RaceResult, entry: Entry) -> int:
    base = next(e for e in result.entries if e.trial == result.baseline_trial)
    if not entry.rounds or not base.rounds:
        return min(len(entry.rates), len(base.rates))
    return len(set(entry.rounds) & set(base.rounds))


def resource_key(record: TrialRecord, study: StudyRecord) -> tuple:
    c = record.config
    draft_bytes = (
        (study.drafts.get(c.draft) or {}).get("file_size_bytes", 0) if c.speculative and c.draft else 0
    )
    return (c.threads, draft_bytes)


class _Launcher:
    """Launches for a race: one finalist alone or a round of several, each timed (the time left is
    planned on them) and its drafted and accepted tokens kept per finalist."""

    def __init__(
        self,
        records: dict[str, TrialRecord],
        remeasure: Remeasure,
        progress: eta.Progress,
        users: int | None = None,
    ):
        self.contenders = {name: contender(name, r, users) for name, r in records.items()}
        self.remeasure = remeasure
        self.drafted = dict.fromkeys(records, 0)
        self.accepted: dict[str, list[int]] = {name: [] for name in records}
        self.watch = eta.Stopwatch(progress)

    def _rate(self, name: str, launched: Launch) -> float:
        self.drafted[name] += launched.drafted
        self.accepted[name].append(launched.accepted)
        return launched.rate

    def launch(self, name: str) -> float:
        return self._rate(name, self.watch.time(1, lambda: self.remeasure.launch(self.contenders[name])))

    def launch_round(self, names: list[str], r: int) -> dict[str, float]:
        launched = self.watch.time(
            len(names), lambda: self.remeasure.round([self.contenders[n] for n in names], r)
        )
        return {name: self._rate(name, one) for name, one in launched.items()}


def run_race(
    study: StudyRecord,
    candidates: list[TrialRecord],
    baseline: TrialRecord,
    workload: Workload,
    settings: MeasurementSettings,
    spec: RaceSpec,
    log_dir: Path,
    progress: Callable[[str], None] = print,
    launch_sigma: float | None = None,
    users: int | None = None,
    size: launch_size.LaunchSize | None = None,
) -> RaceResult:
    """Rounds of launches until decided or out of rounds; confirmation rounds when ``race.confirm_rounds`` asks.
    With ``users``, a load class's race: each launch serves that many users at once (``remeasure.Contender``).
    With ``size``, each launch measures what it says (``tuner.decisions.launch_size``), and ``race.max_rounds``
    becomes as many rounds as fit in the time of that many one-pass rounds."""
    records = {label(r): r for r in [*candidates, baseline]}
    progress = eta.as_progress(progress)
    launcher = _Launcher(records, Remeasure(workload, settings, log_dir, progress, size), progress, users)
    title = race_title(users)
    spec = replace(spec, max_rounds=size.rounds(spec.max_rounds)) if size else spec
    _announce(records, spec, progress, launch_sigma, title, size)
    contest, outcome = sequential_race(
        [n for n in records if n != label(baseline)],
        label(baseline),
        launcher.launch_round,
        {n: resource_key(r, study) for n, r in records.items()},
        spec,
        progress,
        title=title,
    )
    confirmation = _confirm_winner(contest, outcome.winner, label(baseline), launcher, spec, progress, title)
    progress.plan(progress.then_s)  # what follows the race (an export's per-type race)
    return RaceResult(
        rounds=max(max(v, default=-1) for v in contest.rounds.values()) + 1,
        baseline_trial=baseline.number,
        entries=_entries(contest, outcome, records, launcher.accepted, users),
        winner=records[outcome.winner].number,
        decided=outcome.decided,
        verdict=outcome.verdict,
        rule=RESOURCE_RULE,
        loss=spec.loss,
        drafted=launcher.drafted,
        outliers=contest.outliers,
        launches=contest.launches,
        confirmation=confirmation,
        loss_bound=figures.or_none(outcome.loss),
        leader=records[outcome.leader].number,
        forecast=outcome.forecast,
        users=users,
        no_bound=outcome.no_bound,
    )


def _confirm_winner(
    contest: Contest,
    winner: str,
    baseline: str,
    launcher: _Launcher,
    spec: RaceSpec,
    progress: eta.Progress,
    title: str,
) -> Confirmation | None:
    """``race.confirm_rounds`` rounds of the winner and the baseline alone (none when the baseline won); their
    launches and outliers count in the contest's."""
    progress.then_units = 0
    if winner == baseline or not spec.confirm_rounds:
        return None
    progress.expect(2 * spec.confirm_rounds)
    progress(f"{title}: confirming {winner} against the baseline in {spec.confirm_rounds} fresh rounds")
    try:
        confirmation, check = confirm(
            winner, baseline, launcher.launch_round, launcher.launch, spec.confirm_rounds
        )
    except UserError as failure:  # the race's figures stand; only the separate figure is missing
        progress(f"{title}: no confirmation figure: {failure}")
        return None
    contest.outliers += [f"confirmation {line}" for line in check.outliers]
    contest.launches += check.launches
    return confirmation


def _announce(
    records: dict[str, TrialRecord],
    spec: RaceSpec,
    progress: eta.Progress,
    launch_sigma: float | None,
    title: str = "race",
    size: launch_size.LaunchSize | None = None,
) -> None:
    """The race's plan (with ``size``: what a launch measures), its expected launches for the time left, and the
    forecast from the launch spread."""
    if size is not None:
        more = f"; at most {spec.max_rounds} rounds in that time" if size.share != 1 else ""
        progress(f"{title}: {size.text()}{more}")
    progress.then_units = 2 * spec.confirm_rounds
    eta.expect(progress, spec.max_rounds * len(records))
    progress(
        f"{title}: {len(records)} finalists ({', '.join(records)}), one launch each per round for "
        f"{spec.min_rounds} rounds, then the leader and the finalists whose comparison with it is open, until one "
        f"is within race.loss ({loss_text(spec.loss)}) of every other, at most {spec.max_rounds} rounds"
    )
    if launch_sigma is not None:
        seconds = progress.unit_s or _trial_seconds(list(records.values()))
        progress(f"{title}: {forecast_before(launch_sigma, len(records), spec, seconds).text()}")


def _trial_seconds(records: list[TrialRecord]) -> float | None:
    """A launch's time, at most: the median finalist trial's (a trial is one launch and all its passes)."""
    spans = [
        r.ended_at - r.started_at for r in records if r.started_at is not None and r.ended_at is not None
    ]
    return statistics.median(spans) if spans else None


def confirm(
    winner: str,
    baseline: str,
    launch_round: Callable[[list[str], int], dict[str, float]],
    relaunch: Callable[[str], float],
    rounds: int,
) -> tuple[Confirmation, Contest]:
    """The winner and the baseline alone for ``rounds`` fresh rounds: a figure from rounds not used to pick it."""
    pair = [winner, baseline]
    check = Contest({n: [] for n in pair}, list(pair))
    for r in range(rounds):
        launched = launch_round(pair, r)
        if len(launched) < len(pair):
            failed = ", ".join(n for n in pair if n not in launched)
            raise UserError(f"confirmation round {r + 1}: {failed} failed to launch twice")
        _add_confirmation_round(check, launched, relaunch)
    ratio = evidence.ratio(check.rates[winner], check.rates[baseline])
    return Confirmation(
        rounds, check.rates[winner], check.rates[baseline], ratio.estimate, ratio.low, ratio.high
    ), check


def _entries(
    contest: Contest,
    outcome: Outcome,
    records: dict[str, TrialRecord],
    accepted: dict[str, list[int]],
    users: int | None = None,
) -> list[Entry]:
    entries = []
    for name, rates in contest.rates.items():
        r = records[name]
        ratio = outcome.speedups[name]
        status = (
            "winner"
            if name == outcome.winner
            else "within race.loss"
            if name in outcome.equivalent
            else f"dropped: {contest.dropped[name]}"
            if name in contest.dropped
            else "leader"
            if name == outcome.leader
            else "undecided"
        )
        entries.append(
            Entry(
                r.number,
                name,
                r.config.as_dict(),
                recorded_rate(r, users),
                rates,
                evidence.geometric_mean(rates),
                ratio.estimate,
                ratio.low,
                ratio.high,
                status,
                accepted[name],
                [i + 1 for i in contest.rounds.get(name, [])],
            )
        )
    return sorted(entries, key=lambda e: (e.status == "winner", e.speedup), reverse=True)


def race_study(
    ctx: StudyInputs,
    study: optuna.Study,
    progress: Callable[[str], None] = print,
    candidates: list[TrialRecord] | None = None,
    launch_s: float | None = None,
    users: int | None = None,
) -> RaceResult | None:
    """Race a study's finalists (or the given candidates) against its baseline; stored with the study.
    None when there is nothing to race: no feasible trial other than the baseline itself. ``launch_s``:
    a launch as the study's estimate has it, for the remaining time before the first is measured. With
    ``users``, the load class of that many users at once (``tuner.decisions.load_race``), stored as its own."""
    base = store.baseline_record(study)
    if base is None:
        return None
    records = store.read_trials(study)
    pool = (
        candidates
        if candidates is not None
        else finalists(records, ctx.settings.noise_cv, ctx.spec.race.max_finalists, users)
    )
    pool = [r for r in pool if r.config != base.config]
    if not pool:
        return None
    progress = eta.as_progress(progress)
    if progress.unit_s is None:  # no trial measured in this command: a launch as the study estimates it
        progress.unit_s = launch_s
    sentinels = Sentinels(records, ctx.settings.noise_cv)
    size = (
        launch_size.from_trials(
            [*pool, base], sentinels.launch_estimate(), ctx.workload, ctx.spec.race.max_rounds
        )
        if users is None
        else None
    )
    result = run_race(
        store.read_study_record(study),
        pool,
        base,
        ctx.workload,
        ctx.settings,
        ctx.spec.race,
        ctx.log_dir,
        progress,
        sentinels.launch_estimate(),  # the forecast before racing: a point estimate, not a bound
        users,
        size,
    )
    if users is None:
        store.write_race(study, result.to_json())
    else:
        store.write_load_race(study, users, result.to_json())
    return result


def verdict_lines(result: RaceResult) -> list[str]:
    """What an operator reads: the table, the verdict, what the deployment may lose, the forecast, outliers, and the
    deployed configuration's figure. A load class's lines begin with its level (``c4 verdict: ...``)."""
    tag = "" if result.users is None else f"c{result.users} "
    rate = (
        "geometric mean tokens/s"
        if result.users is None
        else f"geometric mean aggregate tokens/s at {users_text(result.users)}"
    )
    lines = [
        f"{result.title}: {result.rounds} rounds, {result.launches} launches (per finalist: {rate} over its "
        f"launches; speedup over the baseline on paired rounds, 95% interval simultaneous over the finalists):"
    ]
    for e in result.entries:
        mark = "*" if e.trial == result.winner else " "
        figure = "baseline" if e.trial == result.baseline_trial else result.speedup_of(e).text()
        lines.append(
            f" {mark} trial {e.trial:>3}: {figures.figure(e.mean_tokens_per_second, '8.1f')} t/s over {len(e.rates)} "
            f"launches (recorded {figures.figure(e.recorded_tokens_per_second, '.1f')}), {figure} | {e.status} | "
            + " ".join(f"{k}={v}" for k, v in e.config.items())
        )
    lines.append(f"{tag}verdict: {result.verdict}")
    lines.append(f"{tag}loss: {result.loss_line()}")
    if result.forecast:
        lines.append(f"{tag}forecast: {result.forecast}")
    lines += [f"{tag}outlier: {line}" for line in result.outliers]
    w = result.winning
    lines.append(f"{tag}winner: trial {w.trial}, {result.figure()}")
    if result.baseline_deployed and (best := result.best_candidate) is not None:
        lines.append(
            f"{tag}best candidate: trial {best.trial}, {result.speedup_of(best).text()} over the baseline "
            "(not shown faster)"
        )
    return lines
