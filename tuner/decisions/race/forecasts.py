"""What settling a race would take: paired rounds and minutes to tell race.loss apart at a per-round spread,
before racing (from the study's sentinels) and after an undecided race (from its own rounds)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner import figure_text
from tuner.decisions import evidence
from tuner.decisions.race.paired_statistics import PairedStatistics, race_alpha
from tuner.decisions.race.wording import loss_text
from tuner.studyfile.spec import RaceSpec


@dataclass(frozen=True, kw_only=True)
class Forecast:
    """What telling ``margin`` apart would take at a per-round spread: more paired rounds, and minutes; after a
    race, the rival it is about, where its estimate stands, and the rounds if the two were level."""

    margin: float  # fraction
    spread: float  # sd of one round's log ratio
    rounds: float  # infinite: the spread is not known yet
    minutes: float | None
    more: bool = True  # rounds on top of those raced (after a race), or in all (before one)
    source: str = ""  # where the spread comes from, when not from the race
    rival: str = ""
    behind: float = 0.0  # the rival's estimate below the deployed one (fraction; negative: ahead)
    level_rounds: float | None = None

    def text(self) -> str:
        if not (figure_text.finite(self.rounds) and figure_text.finite(self.spread)):
            return (
                f"to tell {loss_text(self.margin)} apart: no forecast yet (the per-round spread is not known)"
            )
        where = ""
        if self.rival:
            side = f"{self.behind:.1%} behind" if self.behind >= 0 else f"{-self.behind:.1%} ahead"
            where = f", with {self.rival} {side} as estimated" + (
                f"; about {figure_text.figure(self.level_rounds, '.0f')} if the two are level"
                if self.level_rounds
                else ""
            )
        return (
            f"to tell {loss_text(self.margin)} apart at this host's {self.spread:.1%} per-round spread{self.source}: "
            f"about {self.rounds:.0f}{' more' if self.more else ''} round{'s' if self.rounds != 1 else ''}"
            f"{_minutes_text(self.minutes)}{where}"
        )


def _minutes_text(minutes: float | None) -> str:
    if minutes is None or not math.isfinite(minutes):
        return ""
    return " (under a minute)" if minutes < 0.5 else f" (about {minutes:.0f} min)"


def rounds_to_tell(sd: float, margin: float, mean: float, t_value: float) -> float:
    """Paired rounds for a bound on log(other/deployed) estimated at ``mean`` to settle: below ``margin`` (the
    other is within it) or, if the other is ahead, the other shown faster; the nearer of the two. ``t_value``:
    Student's t at the race's level. Infinite where the spread is not known (``Forecast`` then says so)."""
    room = max(margin - mean, mean, margin / 2)
    rounds = (t_value * sd / room) ** 2 if room > 0 else math.inf
    return float(math.ceil(rounds)) if figure_text.finite(rounds) else math.inf


def forecast_after(look: PairedStatistics, winner: str, open_: list[str], spec: RaceSpec) -> str:
    """The rounds the deployed and its most open rival would need, at the race's own spread and error level."""
    rival = max(open_, key=lambda j: look.upper(j, winner))
    gap = look.gap(rival, winner)
    if not math.isfinite(gap.sd) or gap.df < 1:
        return ""
    t_value, margin = evidence.t_quantile(1 - look.alpha, gap.df), math.log1p(spec.loss)
    more = max(rounds_to_tell(gap.sd, margin, gap.mean, t_value) - math.floor(gap.rounds), 1.0)
    level = max(rounds_to_tell(gap.sd, margin, 0.0, t_value) - math.floor(gap.rounds), 1.0)
    race_rounds = look.race_rounds
    per_launch = race_rounds.elapsed / race_rounds.launches if race_rounds.launches else 0.0
    minutes = 2 * more * per_launch / 60 if per_launch > 0.5 else None
    behind = -math.expm1(gap.mean)
    return Forecast(
        margin=spec.loss,
        spread=gap.sd,
        rounds=more,
        minutes=minutes,
        rival=rival,
        behind=behind,
        level_rounds=level if level != more else None,
    ).text()


def forecast_before(
    launch_sigma: float, contenders: int, spec: RaceSpec, seconds_per_launch: float | None
) -> Forecast:
    """Before racing: two equal finalists, each launch spread ``launch_sigma`` (the study's sentinels), at the
    race's error level with the degrees of freedom a full race would have."""
    sd = math.sqrt(2) * launch_sigma
    df = max((contenders - 1) * (spec.max_rounds - 1), 1)
    t_value = evidence.t_quantile(1 - race_alpha(spec, contenders), df)
    rounds = rounds_to_tell(sd, math.log1p(spec.loss), 0.0, t_value)
    minutes = 2 * rounds * seconds_per_launch / 60 if seconds_per_launch else None
    return Forecast(
        margin=spec.loss,
        spread=sd,
        rounds=rounds,
        minutes=minutes,
        more=False,
        source=" (the study's sentinels)",
    )


def bound_at_cap(look: PairedStatistics, leader: str, runner: str, more_rounds: int) -> float:
    """The loss bound of the leader (log) expected at the race's cap from the pick's comparisons alone: the leader
    and the runner-up launched in each of the ``more_rounds`` rounds left, the others rested, at today's estimates
    and spreads (``PairedStatistics.upper_after``); a turn a rested finalist is given narrows it further."""
    return max(
        (
            look.upper_after(j, leader, more_rounds if j == runner else 0, more_rounds)
            for j in look.race_rounds.candidates
            if j != leader
        ),
        default=-math.inf,
    )
