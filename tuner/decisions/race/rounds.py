"""The race's rounds so far: each contender's launches, which are left out as outliers and why, who still races
and who left; and how a round's launches are added to them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tuner.decisions import evidence
from tuner.decisions.race.wording import rates_text
from tuner.errors import UserError

RELAUNCHES = 3  # confirmation rounds: launches tried in place of an outlier (two in a row: 1 in 2,500 at 2%)
OUTLIER_CONTEXT = 2  # other launches a launch is compared with before it is judged an outlier (a finalist
# resting after race.min_rounds still has each of its launches checked)


@dataclass
class RaceRounds:
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
    cap_from: int | None = None  # the round the race first foresaw its cap (``allocation.foresee``)
    # per label, the turns it gave to a finalist that sets the stated bound at the cap, each counted as a launch
    passed: dict[str, int] = field(default_factory=dict)

    def table(self) -> dict[str, dict[int, float]]:
        """Per label, round index -> rate."""
        return {n: dict(zip(self.rounds.get(n, range(len(v))), v)) for n, v in self.rates.items()}


def add_round(race_rounds: RaceRounds, launched: dict[str, float], round_index: int) -> None:
    """Record a round's launches, then judge again every launch of each contender launched: left out when far from
    all its other launches (those left out included), else kept; the figures use the kept ones.

    Why leave it out: a launch made again later is not in its round (the round's shift is not its own), and the
    race launches by doubt anyway: a contender left with too few rounds for a bound sets the loss bound and is
    launched in the next round (``allocation.next_round``). Why judge again, against every launch: a contender
    whose first launches were slow (two outliers in three) would otherwise have each good launch judged against
    them and left out for the rest of the race, and the baseline could be deployed over a finalist many times
    faster."""
    race_rounds.launches += len(launched)
    for name, value in launched.items():
        race_rounds.measured.setdefault(name, {})[round_index] = value
    for name in launched:
        measured = race_rounds.measured[name]
        kept: list[int] = []
        for at, value in measured.items():
            others = [v for r, v in measured.items() if r != at]
            judged = len(others) >= OUTLIER_CONTEXT or not value > 0
            if judged and evidence.is_outlier(value, others):
                race_rounds.left_out[(name, at)] = (
                    f"round {at + 1}: {name} measured {value:.1f} t/s, far from its other rounds "
                    f"({rates_text(others)}); left out"
                )
            else:
                race_rounds.left_out.pop((name, at), None)
                kept.append(at)
        race_rounds.rates[name] = [measured[at] for at in kept]
        race_rounds.rounds[name] = kept
    race_rounds.outliers = [
        race_rounds.left_out[k] for k in sorted(race_rounds.left_out, key=lambda k: (k[1], k[0]))
    ]


def add_confirmation_round(
    race_rounds: RaceRounds, launched: dict[str, float], relaunch: Callable[[str], float]
) -> None:
    """Append a confirmation round's rates; a launch far from its contender's other launches is launched again
    until it is not or ``RELAUNCHES`` launches were tried (a fixed pair of lists: nothing else would fill it).
    Every launch is checked as soon as its contender has ``OUTLIER_CONTEXT`` other launches (the first ones later,
    retroactively), and no launch is checked twice."""
    race_rounds.launches += len(launched)
    for name, value in launched.items():
        race_rounds.rates[name].append(value)
    for name in launched:
        rates = race_rounds.rates[name]
        for index, value in enumerate(rates):
            if (name, index) in race_rounds.vetted or (len(rates) - 1 < OUTLIER_CONTEXT and value > 0):
                continue
            race_rounds.vetted.add((name, index))
            others = rates[:index] + rates[index + 1 :]
            if not evidence.is_outlier(value, others):
                continue
            tried: list[float] = []
            while len(tried) < RELAUNCHES and (not tried or evidence.is_outlier(tried[-1], others)):
                tried.append(relaunch(name))
            race_rounds.launches += len(tried)
            rates[index] = tried[-1]
            race_rounds.outliers.append(
                f"round {index + 1}: {name} measured {value:.1f} t/s, far from its other rounds "
                f"({rates_text(others)}); launched again: {rates_text(tried)} t/s (the last used)"
            )


def leave_failed(
    race_rounds: RaceRounds,
    chosen: list[str],
    launched: dict[str, float],
    baseline: str,
    title: str,
    round_index: int,
) -> list[str]:
    """Who was launched this round. A finalist whose launch failed twice leaves the race (its launches so far stay
    in the table), so the others' rounds are not lost with it; without the baseline nothing can be shown faster,
    and without a finalist there is nothing to race: either ends the race with the failure."""
    for name in [n for n in chosen if n not in launched]:
        if name == baseline:
            raise UserError(
                f"{title}: the baseline ({name}) failed to launch twice in round {round_index + 1}, and without "
                "it nothing can be shown faster (the reason is on the line above)"
            )
        race_rounds.candidates.remove(name)
        race_rounds.dropped[name] = f"failed to launch twice in round {round_index + 1}"
    if len(race_rounds.candidates) < 2:
        raise UserError(
            f"{title}: every finalist failed to launch twice (the reasons are on the lines above)"
        )
    return [n for n in chosen if n in launched]
