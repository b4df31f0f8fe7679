"""Who is launched in the next round: every finalist at first, then the comparisons that set the pick and the
loss bound; whether a decision is forecast by race.max_rounds; and, once the race can see it will stop at its cap,
the finalists that set the loss bound it will state there."""

from __future__ import annotations

import math

from tuner.decisions import evidence
from tuner.decisions.race.paired_statistics import NORMAL, PairedStatistics
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
    return _in_reach(look, spec, spec.max_rounds - done)


def _in_reach(look: PairedStatistics, spec: RaceSpec, more_rounds: int) -> bool:
    leader = look.leader
    others = [j for j in look.race_rounds.candidates if j != leader]
    return bool(others) and max(_forecast_bound(look, j, leader, more_rounds) for j in others) <= math.log1p(
        spec.loss
    )


def rounds_left(race_rounds: RaceRounds, spec: RaceSpec, done: int) -> int:
    """The rounds a race may still run after ``done``: to race.max_rounds and, with race.budget_minutes, those that
    start before the budget is spent at the time a launch has taken so far (rounds as large as the last one)."""
    left = spec.max_rounds - done
    if spec.budget_minutes and race_rounds.launches and race_rounds.elapsed > 0:
        last = max((max(m) for m in race_rounds.measured.values() if m), default=-1)
        per_round = sum(last in m for m in race_rounds.measured.values()) or 1
        seconds = race_rounds.elapsed / race_rounds.launches * per_round
        time_left = 60 * spec.budget_minutes - race_rounds.elapsed
        left = min(left, max(math.ceil(time_left / seconds), 0))
    return max(left, 0)


def _forecast_expected_loss(look: PairedStatistics, leader: str, more_rounds: int) -> float:
    """The expected loss of deploying the leader (``PairedStatistics.expected_loss``) after ``more_rounds`` more
    rounds of every comparison, at today's estimates and spread: the soonest the expected-loss stop could come."""
    total = 0.0
    for other in look.race_rounds.candidates:
        if other == leader:
            continue
        gap = look.gap(other, leader)
        if not math.isfinite(gap.half(look.alpha)) or gap.sd <= 0:
            return math.inf
        standard_error = gap.sd / math.sqrt(gap.rounds + more_rounds)
        standardized = gap.mean / standard_error
        total += standard_error * (NORMAL.pdf(standardized) + standardized * NORMAL.cdf(standardized))
    return total


def cap_foreseen(look: PairedStatistics, spec: RaceSpec, done: int) -> bool:
    """The race can see that it will stop at its cap (race.max_rounds or the rounds race.budget_minutes leaves):
    neither a decision nor the expected-loss stop is forecast by then, even if every comparison got every round
    left (at today's estimates and spread). From then on the loss bound the race states at its cap is what its
    remaining launches can still change."""
    left = rounds_left(look.race_rounds, spec, done)
    if left < 1 or len(look.race_rounds.candidates) < 2 or _in_reach(look, spec, left):
        return False
    if not spec.expected_loss:
        return True
    return _forecast_expected_loss(look, look.leader, left) >= math.log1p(spec.expected_loss)


def past_first_rounds(spec: RaceSpec, done: int) -> bool:
    """The rounds every finalist is launched in are over (``race.min_rounds``, and enough for a bound)."""
    return done >= max(spec.min_rounds, evidence.MIN_ROUNDS)


def next_round(
    race_rounds: RaceRounds,
    look: PairedStatistics | None,
    baseline: str,
    spec: RaceSpec,
    done: int,
    *,
    foresee_cap: bool = True,
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
    loss bound, and each round goes to the comparisons that set them.

    Once the cap is foreseen (``cap_foreseen``; ``foresee_cap=False`` keeps the allocation before this rule, the
    reference the bench compares it with), as many finalists besides the leader as that rule names are launched, but
    those whose stated bound over the leader (``PairedStatistics.upper``: the pair's own spread where it is the
    larger) is the largest: the race will stop undecided and state the largest of these bounds, so its last launches
    go where they narrow it most (the expected-opportunity-cost allocations spend their last samples so). Why not
    the pooled bound the rule above ranks by: a rested finalist whose own spread on its few rounds came out wide
    sets the stated bound, yet ranks low at the pooled spread, so it rested to the end and the race stated its
    bound, wide, at the cap. The baseline, while the leader is not shown faster than it, is launched as before."""
    live = race_rounds.candidates
    if look is None or not past_first_rounds(spec, done):
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
    if others and foresee_cap and cap_foreseen(look, spec, done):
        fixed = {leader} | ({baseline} & chosen)
        setting = sorted(
            (j for j in others if j not in fixed), key=lambda j: look.upper(j, leader), reverse=True
        )
        chosen = fixed | set(setting[: len(chosen - fixed)])
    return [n for n in live if n in chosen]
