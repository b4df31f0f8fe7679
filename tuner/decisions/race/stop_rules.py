"""When a race stops and what it deploys: decided once some finalist is within race.loss of every other and may
replace the baseline (the resource rule among those within it, the baseline winning a tie); else stopped at
race.max_rounds or the time budget, or once more rounds would rarely change the pick, the highest estimate
deployed. Each outcome's verdict and each finalist's standing, from the same bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tuner.decisions import evidence
from tuner.decisions.race.allocation import decision_in_reach
from tuner.decisions.race.forecasts import forecast_after
from tuner.decisions.race.paired_statistics import PairedStatistics
from tuner.decisions.race.rounds import RaceRounds
from tuner.decisions.race.wording import bound_text, loss_text
from tuner.studyfile.spec import RaceSpec

RESOURCE_RULE = (
    "among configurations within race.loss of every other finalist: fewer threads, then the smaller draft model "
    "(none is smallest)"
)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """How a race ended: who is deployed, whether it was decided, in words, and the figures behind it."""

    winner: str
    decided: bool
    verdict: str  # one sentence: how the winner was decided
    equivalent: list[str]  # within race.loss of every other finalist (the resource rule chose among them)
    leader: str  # the highest estimate
    loss: float = 0.0  # the winner may be at most this much slower than the best finalist (fraction, 95%)
    no_bound: str = ""  # why ``loss`` is not a number (infinite): PairedStatistics.no_bound
    speedup: evidence.Ratio | None = None  # the winner over the baseline, simultaneous 95% interval
    forecast: str = ""  # what settling would take, when undecided
    speedups: dict = field(default_factory=dict)  # per label: its Ratio over the baseline
    # per label, the table's status: winner, within race.loss, dropped: why, leader, undecided (still open)
    standing: dict[str, str] = field(default_factory=dict)


def decide(
    race_rounds: RaceRounds,
    look: PairedStatistics,
    baseline: str,
    resources: dict[str, tuple],
    spec: RaceSpec,
    rounds: int,
) -> Outcome | None:
    """An outcome once some finalist is within ``race.loss`` of every other (its loss bound below it, on decisive
    bounds) and may replace the baseline; the resource rule chooses among those within it, and the baseline, the
    default, wins a tie."""
    margin = math.log1p(spec.loss)
    everyone = race_rounds.candidates

    def settled(candidate: str) -> bool:
        return all(
            look.upper(j, candidate) <= margin and look.decisive(j, candidate)
            for j in everyone
            if j != candidate
        )

    within = [c for c in everyone if settled(c)]
    if baseline in within:
        winner = baseline
    else:
        replacing = [c for c in within if look.replaces(c, baseline) and look.decisive(baseline, c)]
        if not replacing:
            return None
        winner = min(replacing, key=lambda c: (resources.get(c, ()), -look.estimate(c)))
    return _outcome(
        look, winner, within=[c for c in within if c != winner], baseline=baseline, spec=spec, rounds=rounds
    )


def _outcome(
    look: PairedStatistics,
    winner: str,
    *,
    within: list[str],
    baseline: str,
    spec: RaceSpec,
    rounds: int,
    limit: str = "",
) -> Outcome:
    """The outcome that deploys ``winner``: finalists shown slower than it are marked dropped, each finalist's
    standing and the verdict written, and when undecided, a forecast of what settling would take.

    Decided exactly when no other finalist is open (its bound over ``winner`` above race.loss), whichever rule
    stopped the race: the verdict, the loss line (the largest of those bounds) and the table's statuses read the
    same bounds, so a race whose others are all shown slower or within race.loss never reads "undecided"."""
    loss = look.loss(winner)
    leader = look.leader
    race_rounds = look.race_rounds
    speedups = {n: look.ratio(n, baseline) for n in race_rounds.rates}
    for other in race_rounds.candidates:
        if other != winner and look.upper(other, winner) < 0:
            race_rounds.dropped[other] = f"shown slower than {winner} after {rounds} rounds"
    margin = math.log1p(spec.loss)
    open_ = [j for j in race_rounds.candidates if j != winner and not look.upper(j, winner) <= margin]
    decided = not open_
    best = (
        leader
        if leader != baseline
        else max((n for n in race_rounds.candidates if n != baseline), key=look.estimate)
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
            + f" and is deployed; not told apart from {', '.join(open_)}"
        )
    return Outcome(
        winner=winner,
        decided=decided,
        verdict=verdict,
        equivalent=within,
        leader=leader,
        loss=max(math.expm1(loss), 0.0),
        no_bound=look.no_bound(winner),
        speedup=speedups[winner],
        forecast="" if decided else forecast_after(look, winner, open_, spec),
        speedups=speedups,
        standing={n: _standing(n, race_rounds, winner, leader, within, open_) for n in race_rounds.rates},
    )


def _standing(
    name: str, race_rounds: RaceRounds, winner: str, leader: str, within: list[str], open_: list[str]
) -> str:
    """A finalist's status in the table: winner, within race.loss (of every other, for the resource rule, or of the
    winner), dropped and why, leader, or undecided (open: its bound over the winner above race.loss)."""
    if name == winner:
        return "winner"
    if name in within:
        return "within race.loss"
    if name in race_rounds.dropped:
        return f"dropped: {race_rounds.dropped[name]}"
    if name == leader:
        return "leader"
    return "undecided" if name in open_ else "within race.loss"


def _decided_verdict(
    look: PairedStatistics,
    winner: str,
    within: list[str],
    baseline: str,
    spec: RaceSpec,
    rounds: int,
    leader: str,
) -> str:
    """A decided race's verdict: why no other finalist is open (shown slower than the winner, or within race.loss
    of it), and the finalists that left the race after failed launches, which were never compared."""
    loss = look.loss(winner)
    race_rounds = look.race_rounds
    left = "".join(
        f"; {n} {why}" for n, why in race_rounds.dropped.items() if n not in race_rounds.candidates
    )
    if loss < 0:
        return f"{winner} shown faster than every other finalist after {rounds} rounds{left}"
    if winner == baseline:
        return (
            f"nothing was shown faster than the baseline after {rounds} rounds: no finalist is more than "
            f"{bound_text(loss)} faster than it (95%), within race.loss ({loss_text(spec.loss)}){left}"
        )
    verdict = (
        f"{winner} is within race.loss ({loss_text(spec.loss)}) of every other finalist after {rounds} rounds: "
        f"none is more than {bound_text(loss)} faster (95%)"
    )
    if within:
        verdict += (
            f"; deployed by the resource rule ({RESOURCE_RULE}) among {', '.join([winner, *within])}"
            + (f" ({leader} has the highest estimate)" if leader != winner else "")
        )
    return verdict + left


def _stopped(
    race_rounds: RaceRounds, look: PairedStatistics, baseline: str, spec: RaceSpec, limit: str, rounds: int
) -> Outcome:
    """Out of rounds or time, or once more rounds would rarely change the pick: the highest estimate among the
    finalists shown faster than the baseline (the leader when it is one), else the baseline; undecided unless
    every other finalist is shown slower than it or within race.loss (``_outcome``)."""
    leader = look.leader
    shown = [c for c in race_rounds.candidates if look.replaces(c, baseline)]
    winner = (
        baseline
        if leader == baseline or not shown
        else leader
        if leader in shown
        else max(shown, key=look.estimate)
    )
    return _outcome(look, winner, within=[], baseline=baseline, spec=spec, rounds=rounds, limit=limit)


def settled_enough(
    race_rounds: RaceRounds, look: PairedStatistics, baseline: str, spec: RaceSpec, rounds: int
) -> Outcome | None:
    """An undecided outcome before the last round, when no decision is forecast by race.max_rounds, the leader
    would be deployed (the baseline, or shown faster than it) and deploying it is expected to lose less than
    ``race.expected_loss`` (``PairedStatistics.expected_loss``): further rounds would rarely change the pick,
    though its loss bound (95%) may still be wide. Why: on a typical host a race rarely gets every bound within
    race.loss by its last round, and those rounds cost more than the pick they could change."""
    leader = look.leader
    if not spec.expected_loss or rounds >= spec.max_rounds or decision_in_reach(look, spec, rounds):
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
    return _stopped(race_rounds, look, baseline, spec, why, rounds)


def out_of_budget(
    race_rounds: RaceRounds, look: PairedStatistics, baseline: str, spec: RaceSpec, rounds: int, late: bool
) -> Outcome | None:
    """The outcome at race.max_rounds, or once race.budget_minutes is spent (``late``): undecided while some other
    finalist is open."""
    if rounds >= spec.max_rounds:
        limit = f"race.max_rounds ({spec.max_rounds}) reached"
    elif late:
        limit = f"the time budget ({spec.budget_minutes} min) reached"
    else:
        return None
    return _stopped(race_rounds, look, baseline, spec, limit, rounds)
