"""Who is launched in the next round: every finalist at first, then the comparisons that set the pick and the
loss bound; and whether a decision is forecast by race.max_rounds."""

from __future__ import annotations

import math

from tuner.decisions import evidence
from tuner.decisions.race.paired_statistics import PairedStatistics
from tuner.decisions.race.rounds import RaceRounds
from tuner.studyfile.spec import RaceSpec


def _forecast_bound(look: PairedStatistics, name: str, leader: str, more_rounds: int) -> float:
    """The bound of ``name`` over the leader forecast for ``more_rounds`` more rounds of both, at today's estimate
    and spread."""
    gap = look.gap(name, leader)
    return gap.mean + gap.half(look.alpha, gap.rounds + more_rounds)


def _pooled_upper(look: PairedStatistics, name: str, leader: str) -> float:
    """The bound of ``name`` over the leader at the race's pooled spread: which comparison sets the loss bound,
    without a pair's own spread of a few rounds deciding where the next launch goes."""
    gap = look.gap(name, leader)
    if look.spread is None:
        return gap.upper(look.alpha)
    pooled = evidence.Gap(
        mean=gap.mean, sd=math.sqrt(2) * look.spread.sigma, rounds=gap.rounds, df=gap.df, paired=gap.paired
    )
    return gap.mean + pooled.half(look.alpha)


def decision_in_reach(look: PairedStatistics, spec: RaceSpec, done: int) -> bool:
    """A decision is forecast by race.max_rounds: every bound over the leader below race.loss then, at today's
    estimates and spread."""
    leader = look.leader
    others = [j for j in look.race_rounds.candidates if j != leader]
    return bool(others) and max(
        _forecast_bound(look, j, leader, spec.max_rounds - done) for j in others
    ) <= math.log1p(spec.loss)


def next_round(
    race_rounds: RaceRounds, look: PairedStatistics | None, baseline: str, spec: RaceSpec, done: int
) -> list[str]:
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
    live = race_rounds.candidates
    if look is None or done < max(spec.min_rounds, evidence.MIN_ROUNDS):
        return list(live)
    leader = look.leader
    others = [j for j in live if j != leader]
    chosen = {leader}
    if others:
        chosen.add(max(others, key=look.estimate))
        chosen.add(max(others, key=lambda j: _pooled_upper(look, j, leader)))
        if decision_in_reach(look, spec, done):
            chosen |= {j for j in others if not look.decisive(j, leader)}
    if baseline in live and not look.replaces(leader, baseline):
        chosen.add(baseline)
    return [n for n in live if n in chosen]
