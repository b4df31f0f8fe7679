"""The race's loops, pure apart from the launches they are handed (so ``make bench`` runs this same code on a
simulated host): rounds until a stop rule ends the race, and confirmation rounds of the winner and the baseline."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from tuner.decisions import evidence
from tuner.decisions.race.allocation import foresee, next_round
from tuner.decisions.race.operator_lines import cap_line, round_line
from tuner.decisions.race.paired_statistics import PairedStatistics, first_look, race_alpha
from tuner.decisions.race.results import Confirmation
from tuner.decisions.race.rounds import RaceRounds, add_confirmation_round, add_round, leave_failed
from tuner.decisions.race.stop_rules import Outcome, decide, out_of_budget, settled_enough
from tuner.errors import UserError
from tuner.progress import Progress
from tuner.studyfile.spec import RaceSpec


@dataclass(frozen=True)
class LoopOptions:
    """What a race's loop is told besides its contenders and rules, each with a default: the title its lines
    carry (a load class's race names its users), the clock its time budget reads (a test's own) and the rule
    that foresees its cap (``allocation.foresee``), the error level of each look (``race_alpha``: spec,
    contenders, rounds done) and when a pair's own spread bounds its gap (``evidence.wider_than_chance``); a
    benchmark races its own references in their place."""

    title: str = "race"
    clock: Callable[[], float] = time.monotonic
    foresee: Callable[[RaceRounds, PairedStatistics, RaceSpec, int], bool] = foresee
    level: Callable[[RaceSpec, int, int | None], float] = race_alpha
    own_level: float | None = evidence.OWN_SPREAD_LEVEL


def sequential_race(
    labels: list[str],
    baseline: str,
    launch_round: Callable[[list[str], int], dict[str, float]],
    resources: dict[str, tuple],
    spec: RaceSpec,
    *,
    progress: Progress,
    options: LoopOptions = LoopOptions(),
) -> tuple[RaceRounds, Outcome]:
    """Rounds of launches until some finalist is within ``race.loss`` of every other and may replace the baseline.

    ``launch_round(labels, round_index)`` launches each once and returns its rate; ``resources[label]`` orders
    equals (smaller first). Pure apart from that call, so ``make bench`` runs this same code on a simulated
    host."""
    clock, title = options.clock, options.title
    everyone = list(dict.fromkeys([*labels, baseline]))
    race_rounds = RaceRounds(
        rates={n: [] for n in everyone}, candidates=list(everyone), rounds={n: [] for n in everyone}
    )
    first = first_look(spec)
    cap_alpha = options.level(spec, len(everyone), spec.max_rounds)
    started = clock()
    deadline = started + 60 * spec.budget_minutes if spec.budget_minutes else math.inf
    look = None
    for round_index in range(spec.max_rounds):
        if look is not None and options.foresee(race_rounds, look, spec, round_index):
            progress(cap_line(look, spec, round_index, title))
        chosen = next_round(race_rounds, look, baseline, spec, round_index)
        launched = launch_round(chosen, round_index)
        measured = leave_failed(race_rounds, chosen, launched, baseline, title, round_index)
        add_round(race_rounds, launched, round_index)
        race_rounds.elapsed = clock() - started
        level = options.level(spec, len(everyone), round_index + 1)
        look = PairedStatistics(race_rounds, level, cap_alpha, options.own_level)
        outcome = None
        if round_index + 1 >= first:
            done = round_index + 1
            outcome = (
                decide(race_rounds, look, baseline, resources, spec, done)
                or settled_enough(race_rounds, look, baseline, spec, done)
                or out_of_budget(race_rounds, look, baseline, spec, done, clock() >= deadline)
            )
        progress.time.expect(0 if outcome else (spec.max_rounds - round_index - 1) * len(measured))
        progress(round_line(race_rounds, look, measured, round_index, outcome, title))
        if outcome is not None:
            return race_rounds, outcome
    raise AssertionError("a race's last round always ends it (first_look is at most race.max_rounds)")


def confirm(
    winner: str,
    baseline: str,
    launch_round: Callable[[list[str], int], dict[str, float]],
    relaunch: Callable[[str], float],
    rounds: int,
) -> tuple[Confirmation, RaceRounds]:
    """The winner and the baseline alone for ``rounds`` fresh rounds: a figure from rounds not used to pick it."""
    pair = [winner, baseline]
    check = RaceRounds(rates={n: [] for n in pair}, candidates=list(pair))
    for round_index in range(rounds):
        launched = launch_round(pair, round_index)
        if len(launched) < len(pair):
            failed = ", ".join(n for n in pair if n not in launched)
            raise UserError(f"confirmation round {round_index + 1}: {failed} failed to launch twice")
        add_confirmation_round(check, launched, relaunch)
    ratio = evidence.ratio(check.rates[winner], check.rates[baseline])
    confirmation = Confirmation(
        rounds=rounds,
        winner_rates=check.rates[winner],
        baseline_rates=check.rates[baseline],
        speedup=ratio.estimate,
        low=ratio.low,
        high=ratio.high,
    )
    return confirmation, check
