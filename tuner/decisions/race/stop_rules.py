"""When a race stops and what it deploys: decided once some finalist is within race.loss of every other and may
replace the baseline (the resource rule among those within it, the baseline winning a tie); undecided at
race.max_rounds or the time budget, or once more rounds would rarely change the pick. Each outcome's verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tuner.decisions import evidence
from tuner.decisions.evidence import DECISION_ROUNDS
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
        look,
        winner,
        decided=True,
        within=[c for c in within if c != winner],
        baseline=baseline,
        spec=spec,
        rounds=rounds,
    )


def _outcome(
    look: PairedStatistics,
    winner: str,
    *,
    decided: bool,
    within: list[str],
    baseline: str,
    spec: RaceSpec,
    rounds: int,
    limit: str = "",
) -> Outcome:
    """The outcome that deploys ``winner``: finalists shown slower than it are marked dropped, the verdict
    written, and when undecided, a forecast of what settling would take."""
    loss = look.loss(winner)
    leader = look.leader
    speedups = {n: look.ratio(n, baseline) for n in look.race_rounds.rates}
    for other in look.race_rounds.candidates:
        if other != winner and look.upper(other, winner) < 0:
            look.race_rounds.dropped[other] = f"shown slower than {winner} after {rounds} rounds"
    margin = math.log1p(spec.loss)
    open_ = [j for j in look.race_rounds.candidates if j != winner and look.upper(j, winner) > margin]
    best = (
        leader
        if leader != baseline
        else max((n for n in look.race_rounds.candidates if n != baseline), key=look.estimate)
    )
    if decided:
        verdict = _decided_verdict(look, winner, within, baseline, spec, rounds, leader)
    elif winner == baseline:
        verdict = (
            f"nothing was shown faster than the baseline after {rounds} rounds ({limit}): the baseline "
            f"is deployed; {best} has the highest estimate ({speedups[best].text()} over it)"
        )
    else:
        verdict = _undecided_verdict(winner, leader, open_, spec, rounds, limit)
    forecast = "" if decided or not open_ else forecast_after(look, winner, open_, spec)
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


def _undecided_verdict(
    winner: str, leader: str, open_: list[str], spec: RaceSpec, rounds: int, limit: str
) -> str:
    """An undecided race's verdict when a finalist, not the baseline, is deployed."""
    return (
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


def _decided_verdict(
    look: PairedStatistics,
    winner: str,
    within: list[str],
    baseline: str,
    spec: RaceSpec,
    rounds: int,
    leader: str,
) -> str:
    loss = look.loss(winner)
    if loss < 0:
        return f"{winner} shown faster than every other finalist after {rounds} rounds"
    if winner == baseline:
        return (
            f"nothing was shown faster than the baseline after {rounds} rounds: no finalist is more than "
            f"{bound_text(loss)} faster than it (95%), within race.loss ({loss_text(spec.loss)})"
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
    return verdict


def _undecided(
    race_rounds: RaceRounds, look: PairedStatistics, baseline: str, spec: RaceSpec, limit: str, rounds: int
) -> Outcome:
    """Out of rounds or time: the highest estimate among the finalists shown faster than the baseline (the leader
    when it is one), else the baseline."""
    leader = look.leader
    shown = [c for c in race_rounds.candidates if look.replaces(c, baseline)]
    winner = (
        baseline
        if leader == baseline or not shown
        else leader
        if leader in shown
        else max(shown, key=look.estimate)
    )
    return _outcome(
        look, winner, decided=False, within=[], baseline=baseline, spec=spec, rounds=rounds, limit=limit
    )


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
    return _undecided(race_rounds, look, baseline, spec, why, rounds)


def out_of_budget(
    race_rounds: RaceRounds, look: PairedStatistics, baseline: str, spec: RaceSpec, rounds: int, late: bool
) -> Outcome | None:
    """An undecided outcome at race.max_rounds, or once race.budget_minutes is spent (``late``)."""
    if rounds >= spec.max_rounds:
        limit = f"race.max_rounds ({spec.max_rounds}) reached"
    elif late:
        limit = f"the time budget ({spec.budget_minutes} min) reached"
    else:
        return None
    return _undecided(race_rounds, look, baseline, spec, limit, rounds)
