"""An idealised race on the 32B-scale stand-in (docs/decisions.md#a-pairs-own-spread-when-shown-wider): what median
loss bound nine finalists within 7% at a 5% launch spread can state after a number of launches, at a number of
standard errors, with the spread known, no round model and the launches after the first three each to the leader and
the rival with the widest bound. ``greedy_race``: the same, but each launch after the first ``first`` of every finalist
goes where it lowers the stated bound most (the estimates held), as a race that spends its launches where the stated
loss comes from would. Run: ``python docs/evidence/race_ideal.py`` (standard library only; a few minutes)."""

import math
import random
import statistics

MUS = [math.log(1 - 0.07 * i / 8) for i in range(9)]
SIGMA = 0.05
BASELINE = 3  # the baseline's launches, counted in the budget


def race(seed: int, errors: float, launches: int, first: int = 3) -> tuple[float, float]:
    """One race: the stated loss bound (fraction) and the deployed finalist's true loss (log)."""
    rng = random.Random(seed)
    obs = [[mu + rng.gauss(0, SIGMA) for _ in range(first)] for mu in MUS]

    def estimate(i: int) -> float:
        return statistics.fmean(obs[i])

    def bound(j: int, leader: int) -> float:
        return (
            estimate(j)
            - estimate(leader)
            + errors * SIGMA * math.sqrt(1 / len(obs[j]) + 1 / len(obs[leader]))
        )

    for _ in range(launches - BASELINE - first * len(MUS)):
        leader = max(range(len(MUS)), key=estimate)
        rival = max((j for j in range(len(MUS)) if j != leader), key=lambda j: bound(j, leader))
        pick = rival if len(obs[rival]) < 0.6 * len(obs[leader]) else leader
        obs[pick].append(MUS[pick] + rng.gauss(0, SIGMA))
    leader = max(range(len(MUS)), key=estimate)
    stated = max(bound(j, leader) for j in range(len(MUS)) if j != leader)
    return max(math.expm1(stated), 0.0), -MUS[leader]


def greedy_race(seed: int, errors: float, launches: int, first: int) -> tuple[float, float]:
    """``race`` with each later launch to the finalist whose launch lowers the stated bound most."""
    rng = random.Random(seed)
    obs = [[mu + rng.gauss(0, SIGMA) for _ in range(first)] for mu in MUS]

    def stated(runs: list[list[float]], leader: int) -> float:
        means = [statistics.fmean(r) for r in runs]
        return max(
            means[j] - means[leader] + errors * SIGMA * math.sqrt(1 / len(runs[j]) + 1 / len(runs[leader]))
            for j in range(len(runs))
            if j != leader
        )

    def leading() -> int:
        return max(range(len(MUS)), key=lambda i: statistics.fmean(obs[i]))

    for _ in range(launches - BASELINE - first * len(MUS)):
        leader = leading()
        pick = min(
            range(len(MUS)),
            key=lambda i: stated(
                [r + [statistics.fmean(r)] if j == i else r for j, r in enumerate(obs)], leader
            ),
        )
        obs[pick].append(MUS[pick] + rng.gauss(0, SIGMA))
    leader = leading()
    return max(math.expm1(stated(obs, leader)), 0.0), -MUS[leader]


def summary(races: list[tuple[float, float]]) -> str:
    median = statistics.median(b for b, _ in races)
    holds = statistics.fmean(t <= math.log1p(b) + 1e-12 for b, t in races)
    return f"median {median:.1%}, holds {holds:.1%}"


if __name__ == "__main__":
    for errors in (2.3, 2.5, 2.77, 3.0):
        for launches in (45, 53, 63):
            races = [race(seed, errors, launches) for seed in range(400)]
            print(f"{errors} standard errors, {launches} launches: {summary(races)}")
    for first in (1, 2, 3):
        for errors in (2.5, 2.77):
            races = [greedy_race(seed, errors, 45, first) for seed in range(300)]
            print(
                f"greedy after {first} launch(es) each, {errors} standard errors, 45 launches: {summary(races)}"
            )
