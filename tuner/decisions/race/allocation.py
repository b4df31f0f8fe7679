"""Who is launched in the next round: every finalist at first, then the comparisons that set the pick and the
loss bound; whether a decision is forecast by race.max_rounds; and, once the race can see it will stop at its cap,
the finalists that set the loss bound it will state there."""

from __future__ import annotations

import math

from tuner.decisions import evidence
from tuner.decisions.race.paired_statistics import PairedStatistics
from tuner.decisions.race.rounds import RaceRounds
from tuner.studyfile.spec import RaceSpec


def _forecast_bound(look: PairedStatistics, name: str, leader: str, more_rounds: int) -> float:
    """The bound of ``name`` over the leader forecast for ``more_rounds`` more rounds of both, at today's estimate
    and spread, at the level of the looks before the cap (a decision forecast is one the race may take before it;
    forecast at the cap's share, the stand-in's races took 51.0 launches against 49.4 for a median bound of 7.2%
    against 7.5%: docs/decisions.md#the-cap-buys-its-bound)."""
    gap = look.gap(name, leader)
    return gap.mean + gap.half(look.alpha, gap.rounds + more_rounds)


def _pooled_upper(look: PairedStatistics, name: str, leader: str, passed: int = 0) -> float:
    """The bound of ``name`` over the leader at the race's pooled spread: which comparison sets the loss bound,
    without a pair's own spread of a few rounds deciding where the next launch goes; ``passed`` turns it gave to
    another finalist counted as launches of its own (``_at_cap``)."""
    gap = look.gap(name, leader)
    if look.spread is None:
        return gap.upper(look.alpha)
    worth = look.worth_after(name, leader, passed, 0) if passed else gap.rounds
    pooled = evidence.Gap(
        mean=gap.mean, sd=math.sqrt(2) * look.spread.sigma, rounds=worth, df=gap.df, paired=gap.paired
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
    return look.expected_loss(look.leader, left) >= math.log1p(spec.expected_loss)


def past_first_rounds(spec: RaceSpec, done: int) -> bool:
    """The rounds every finalist is launched in are over (``race.min_rounds``, and enough for a bound)."""
    return done >= max(spec.min_rounds, evidence.MIN_ROUNDS)


def foresee(race_rounds: RaceRounds, look: PairedStatistics, spec: RaceSpec, done: int) -> bool:
    """Whether round ``done`` is the first in which the race foresees its cap (``cap_foreseen``, past the first
    rounds), recorded in ``race_rounds.cap_from``: from then on, to the end, the rounds go as ``next_round`` says
    they go once the cap is foreseen. Why to the end: a forecast that flips back and forth would launch a finalist
    passed over in one round in the next, as if it had never been."""
    if (
        race_rounds.cap_from is not None
        or not past_first_rounds(spec, done)
        or not cap_foreseen(look, spec, done)
    ):
        return False
    race_rounds.cap_from = done
    return True


def runner_up(look: PairedStatistics, leader: str) -> str | None:
    """The finalist with the highest estimate after the leader: which of the two is the best is the pick."""
    others = [j for j in look.race_rounds.candidates if j != leader]
    return max(others, key=look.estimate) if others else None


def _at_cap(look: PairedStatistics, chosen: set[str], runner: str, spec: RaceSpec, done: int) -> set[str]:
    """A round once the cap is foreseen: ``chosen`` (the leader, the runner-up, the baseline while the leader is not
    shown faster than it) and, when the rule before would launch one more finalist (its turn: a rested finalist's
    bound at the pooled spread above the runner-up's), the finalist whose stated bound is the largest among those
    forecast to set the stated bound at the cap above the runner-up's; none such, the one whose turn it is. A turn
    given to another is counted, for the next turn, as a launch of the finalist it was (``RaceRounds.passed``)."""
    race_rounds = look.race_rounds
    leader, passed = look.leader, race_rounds.passed
    pooled = {
        j: _pooled_upper(look, j, leader, passed.get(j, 0)) for j in race_rounds.candidates if j not in chosen
    }
    bar = _pooled_upper(look, runner, leader, passed.get(runner, 0))
    turns = [j for j in pooled if pooled[j] > bar]
    if not turns:
        return chosen
    turn = max(turns, key=lambda j: pooled[j])
    left = rounds_left(race_rounds, spec, done)
    cap = look.upper_after(runner, leader, left, left)
    setting = [j for j in pooled if look.upper_after(j, leader, 0, left) > cap]
    chosen_one = max(setting, key=lambda j: look.upper(j, leader)) if setting else turn
    if chosen_one not in turns:
        passed[turn] = passed.get(turn, 0) + 1
    return chosen | {chosen_one}


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
    loss bound, and each round goes to the comparisons that set them.

    Once the cap is foreseen (``foresee``), the leader and the runner-up are still launched every round (the pick),
    and the baseline as before, but a rested finalist's turn goes to the finalist forecast to set the bound the race
    will state at its cap (``_at_cap``): its own spread on its few rounds (``PairedStatistics.upper``), not the
    pooled one, is what the race states, so a finalist whose own spread came out wide would otherwise rest to the end
    and the race state its bound, wide, at the cap (the expected-opportunity-cost allocations spend their last
    samples where they shrink the reported figure most). Why the pick's comparisons stay: a race that gave their
    rounds to the bound instead deployed a slower configuration more often."""
    live = race_rounds.candidates
    if look is None or not past_first_rounds(spec, done):
        return list(live)
    leader = look.leader
    runner = runner_up(look, leader)
    chosen = {leader}
    if baseline in live and not look.replaces(leader, baseline):
        chosen.add(baseline)
    if runner is None:
        return [n for n in live if n in chosen]
    chosen.add(runner)
    if race_rounds.cap_from is not None:
        chosen = _at_cap(look, chosen, runner, spec, done)
    else:
        others = [j for j in live if j != leader]
        chosen.add(max(others, key=lambda j: _pooled_upper(look, j, leader)))
        if decision_in_reach(look, spec, done):
            chosen |= {j for j in others if not look.decisive(j, leader)}
    return [n for n in live if n in chosen]
