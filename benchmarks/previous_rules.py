"""The reference the decision benchmark (``race_bench``) measures the product against: the race, finalist
cut and pruning rule that the product's own replaced, kept here so that a change to the product's rules is
judged against a fixed bar, not against itself. They decide with the product's statistics
(``tuner.decisions.evidence``, ``tuner.search.pruning``); what is theirs is only the order of the tests:

* the race: every finalist still racing launched every round; from race.min_rounds on, the leader (highest
  geometric mean) compared with each other finalist as if named in advance (one-sided t on its own paired
  rounds at 5% / looks): shown slower dropped, TOST-equivalent within 2% settled; undecided at
  race.max_rounds (the higher estimate); the printed figure from 4 confirmation rounds of the winner and the
  baseline; a launch far from its finalist's other rounds launched again, once;
* the finalists: tokens/s x (1 +- 2 cv) overlapping the leader's, at most 4; and the product's cut before a
  configuration's readings were pooled (``each_reading``): every reading within reach of the best one on its own;
* pruning: the launch spread added once (not on both sides), floored at 2%, no spending over looks;
* the allocation before the cap rule (``never_foresee``): the product's race whose rounds never foresee the cap;
* the error level before the cap's share (``equal_looks``): the race's 5% over its comparisons with the best and
  its looks in equal shares, the look at the cap no different from those before it;
* a pair's spread before the test (``LARGER_SPREAD``, in ``LoopOptions.own_level``'s place): the larger of the
  pair's own spread and the race's pooled one, whenever the pair's own is wider.

They state no loss bound.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from tuner.decisions import evidence
from tuner.decisions.race.finalist_selection import within_reach
from tuner.decisions.race.paired_statistics import PairedStatistics, first_look
from tuner.decisions.race.rounds import RaceRounds
from tuner.search.pruning import SIGMA_FLOOR, Z, paired_ratios
from tuner.studyfile.spec import RaceSpec

SPEC = RaceSpec(min_rounds=3, max_rounds=10, confirm_rounds=4)  # the race's defaults
EQUIVALENCE = 0.02
MAD_FLOOR = 0.05
OUTLIER_CONTEXT = 3
MAX_FINALISTS = 4


@dataclass(frozen=True)
class Outcome:
    """What the race deployed (a finalist's index; the baseline is the last) and what it printed."""

    winner: int
    ratio: evidence.Ratio  # the printed speedup over the baseline
    launches: int
    decided: bool


def _outlier(value: float, others: list[float]) -> bool:
    logs = [math.log(v) for v in others if v > 0 and math.isfinite(v)]
    if not (value > 0 and math.isfinite(value)):
        return True
    if len(logs) < 2:
        return False
    centre = statistics.median(logs)
    mad = max(evidence.MAD_SCALE * statistics.median(abs(x - centre) for x in logs), MAD_FLOOR)
    return abs(math.log(value) - centre) > evidence.OUTLIER_MADS * mad


def _round(rates: dict[int, list[float]], launched: list[int], launch, vetted: set) -> int:
    """Append one launch each, then launch again (once) a launch far from its other rounds; launches used."""
    used = len(launched)
    for candidate in launched:
        rates[candidate].append(launch(candidate))
    for candidate in launched:
        for position, value in enumerate(rates[candidate]):
            if (candidate, position) in vetted or (len(rates[candidate]) - 1 < OUTLIER_CONTEXT and value > 0):
                continue
            vetted.add((candidate, position))
            if _outlier(value, rates[candidate][:position] + rates[candidate][position + 1 :]):
                rates[candidate][position] = launch(candidate)
                used += 1
    return used


def race(launch: Callable[[int], float], resources: list[tuple], spec: RaceSpec = SPEC) -> Outcome:
    """The race (see the module's docstring) over the finalists and the baseline (the last of ``resources``),
    ``launch(index)`` one launch's rate, with its own confirmation rounds."""
    base = len(resources) - 1
    rates: dict[int, list[float]] = {i: [] for i in range(len(resources))}
    vetted: set[tuple[int, int]] = set()  # (finalist, round) launches already judged for outliers
    live, launches = list(rates), 0
    alpha = evidence.ALPHA / (spec.max_rounds - max(spec.min_rounds, evidence.MIN_ROUNDS) + 1)
    winner, decided = None, False
    for round_index in range(spec.max_rounds):
        launches += _round(rates, list(live), launch, vetted)
        if round_index + 1 < max(spec.min_rounds, evidence.MIN_ROUNDS):
            continue
        leader = max(live, key=lambda i: evidence.geometric_mean(rates[i]))
        live = [i for i in live if i == leader or not evidence.shown_better(rates[leader], rates[i], alpha)]
        others = [i for i in live if i != leader]
        same = [i for i in others if evidence.shown_equivalent(rates[leader], rates[i], EQUIVALENCE, alpha)]
        if len(same) == len(others):
            winner, decided = min([leader, *same], key=lambda i: resources[i]), True
            break
    if winner is None:
        winner = max(live, key=lambda i: evidence.geometric_mean(rates[i]))
        decided = len(live) == 1
    if winner == base:
        return Outcome(winner, evidence.Ratio(1.0, 1.0, 1.0, 0), launches, decided)
    pair: dict[int, list[float]] = {winner: [], base: []}
    for _ in range(spec.confirm_rounds):
        launches += _round(pair, [winner, base], launch, set())
    return Outcome(winner, evidence.ratio(pair[winner], pair[base]), launches, decided)


def finalists(recorded: list[tuple[float, float]]) -> list[int]:
    """The finalists of configurations recorded as (tokens/s, cv), fastest first."""
    top = max(range(len(recorded)), key=lambda i: recorded[i][0])
    low = recorded[top][0] * (1 - 2 * recorded[top][1])
    return sorted(
        (i for i in range(len(recorded)) if recorded[i][0] * (1 + 2 * recorded[i][1]) >= low),
        key=lambda i: recorded[i][0],
        reverse=True,
    )[:MAX_FINALISTS]


def each_reading(readings: list[list[tuple[float, float]]], launch: float) -> list[int]:
    """The product's finalist cut before a configuration's recorded readings were pooled: ``readings[i]``, the
    (log rate, cv) of each launch of configuration i; every launch judged on its own against the highest one
    (``within_reach``), a configuration a finalist when any of its launches is in reach, closest first."""
    flat = [(log, cv, i) for i, launches in enumerate(readings) for log, cv in launches]
    kept = within_reach([(log, cv) for log, cv, _ in flat], launch)
    return list(dict.fromkeys(flat[k][2] for k in kept))


def prune(samples: list[dict], incumbent: list[dict], launch: float) -> bool:
    """Whether the pruning rule stops a trial that measured ``samples`` against the incumbent's."""
    pairing = paired_ratios(samples, incumbent)
    if pairing.unseen_suites or len(pairing.ratios) < 3:
        return False
    logs = [math.log(r) for r in pairing.ratios]
    n_ratios = len(logs)
    mean, sd = statistics.fmean(logs), max(statistics.stdev(logs), SIGMA_FLOOR)
    seen_bound = math.exp(mean + Z * sd / math.sqrt(n_ratios))
    unseen_bound = math.exp(max(logs) + Z * sd)
    bound = (pairing.seen * seen_bound + pairing.unseen * unseen_bound) / (pairing.seen + pairing.unseen)
    return bound * math.exp(Z * max(0.02, launch)) < 1.0


def never_foresee(race_rounds: RaceRounds, look: PairedStatistics, spec: RaceSpec, done: int) -> bool:
    """The allocation before the cap rule, in ``LoopOptions.foresee``'s place: the race never foresees its cap, so a
    rested finalist's turn never goes to the one forecast to set the bound stated at the cap."""
    return False


def equal_looks(spec: RaceSpec, contenders: int, done: int | None = None) -> float:
    """The error level before the cap's share, in ``LoopOptions.level``'s place: 5% over the comparisons with the
    best and over the looks in equal shares, whichever look ``done`` is."""
    looks = spec.max_rounds - first_look(spec) + 1
    return evidence.ALPHA / (max(contenders - 1, 1) * looks)


LARGER_SPREAD = None  # LoopOptions.own_level before the test: a pair's own spread whenever it is the wider
