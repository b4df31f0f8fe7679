"""An idealised race on the 32B-scale stand-in (docs/decisions.md#a-pairs-own-spread-when-shown-wider): what median
loss bound nine finalists within 7% at a 5% launch spread can state after a number of launches, at a number of
standard errors, with the spread known, no round model and the launches after the first three each to the leader and
the rival with the widest bound. Run: ``python docs/evidence/race_ideal.py`` (standard library only)."""

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


if __name__ == "__main__":
    for errors in (2.3, 2.5, 2.77, 3.0):
        for launches in (45, 53, 63):
            races = [race(seed, errors, launches) for seed in range(400)]
            median = statistics.median(b for b, _ in races)
            holds = statistics.fmean(t <= math.log1p(b) + 1e-12 for b, t in races)
            print(f"{errors} standard errors, {launches} launches: median {median:.1%}, holds {holds:.1%}")
