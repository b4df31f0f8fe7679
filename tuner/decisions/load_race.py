"""Load classes raced: each level of simultaneous users gets the finalist race's launch-level evidence.

Why: a load class's configuration (an export's ``STUDY-cN`` section) and the break-even (the fewest users at
which speculation stops paying) were each trial's one launch at that level, the best recorded aggregate
tokens/s: the highest of many noisy single figures, as a study's single best is. So each level N is raced like
the pooled finalists (``tuner.decisions.race``): its finalists (``race.finalists`` on the aggregate tokens/s at
N, over the sentinel rate at each trial's time) and the baseline, each launched afresh with N slots and driven
by N clients at once (``remeasure.Contender.users``), in paired rounds until decided, with the same verdicts,
loss bound, forecast and the baseline as the default. Each result is stored with the study
(``store.write_load_race``: ``race_cN``) for export and report.

The break-even from the races (``break_even``): at each raced level, the best speculative contender (the
winner when it speculates) against the best without speculation, on the race's paired rounds: against the
baseline, the race's own simultaneous interval; against another configuration without speculation, a 95%
t-interval on their common rounds. Speculation pays at a level when that interval is wholly above 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna

from tuner.decisions import evidence
from tuner.decisions.race import Entry, RaceResult, race_study, race_title, users_text, verdict_lines
from tuner.decisions.remeasure import StudyInputs
from tuner.knobs.config import method_of
from tuner.machine import hostlock
from tuner.progress import Progress
from tuner.storage import store


def race_levels(
    ctx: StudyInputs,
    study: optuna.Study,
    levels: tuple[int, ...],
    progress: Progress,
    launch_s: float | None = None,
) -> dict[int, RaceResult | None]:
    """Each level's race, fewest users first, stored with the study; None at a level where the baseline is the
    only finalist (nothing to race: an earlier race of that level is cleared)."""
    races: dict[int, RaceResult | None] = {}
    for users in sorted(levels):
        races[users] = race_study(ctx, study, progress, None, launch_s, users)
        if races[users] is None:
            store.write_load_race(study, users, None)
    return races


def read_races(study: optuna.Study) -> dict[int, RaceResult]:
    """The study's stored load-class races by users (a race stored by an older version is left out)."""
    races = {users: RaceResult.from_json(race) for users, race in store.read_load_races(study).items()}
    return {users: race for users, race in races.items() if race is not None}


def speculates(entry: Entry) -> bool:
    return entry.config.get("spec_type", "none") != "none"


@dataclass(frozen=True)
class LevelGain:
    """At one raced level: the best speculative contender over the best without speculation."""

    users: int
    speculative: Entry | None  # None: no speculative finalist (none was within reach of the level's best)
    plain: Entry
    ratio: evidence.Ratio | None

    def text(self) -> str:
        users = users_text(self.users)
        if self.speculative is None or self.ratio is None:
            return f"{users}: no speculative finalist (none within reach of trial {self.plain.trial})"
        return (
            f"{users}: {self.ratio.text()} ({method_of(self.speculative.config)}, trial {self.speculative.trial}, "
            f"over trial {self.plain.trial})"
        )

    @property
    def pays(self) -> bool:
        return self.ratio is not None and self.ratio.low > 1

    @property
    def loses(self) -> bool:
        """Shown slower than no speculation, or no speculative configuration came within reach."""
        return self.ratio is None or self.ratio.high < 1


def level_gain(race: RaceResult) -> LevelGain:
    """The best speculative contender (the winner when it speculates, else the highest estimate) over the best
    without speculation (the baseline is one), on the race's paired rounds."""
    spec = [e for e in race.entries if speculates(e)]
    plain = max((e for e in race.entries if not speculates(e)), key=lambda e: e.speedup)
    winner = race.winning
    best = winner if speculates(winner) else max(spec, key=lambda e: e.speedup, default=None)
    if best is None:
        return LevelGain(race.users or 1, None, plain, None)
    if plain.trial == race.baseline_trial:
        ratio = race.speedup_of(best)
    else:
        common = sorted(set(best.rounds) & set(plain.rounds))
        best_rates, plain_rates = dict(zip(best.rounds, best.rates)), dict(zip(plain.rounds, plain.rates))
        ratio = evidence.ratio([best_rates[r] for r in common], [plain_rates[r] for r in common])
    return LevelGain(race.users or 1, best, plain, ratio)


def break_even(races: dict[int, RaceResult]) -> str:
    """Where speculation stops paying on this host, from the load-class races: the fewest raced users at which
    the best speculative contender is not shown to serve more tokens/s in all than the best without."""
    gains = [level_gain(races[users]) for users in sorted(races)]
    how = (
        "; ".join(g.text() for g in gains)
        + "; best speculative over best without speculation in each level's race, aggregate tokens/s on paired "
        "launch rounds, 95% interval"
    )
    first = next((g for g in gains if not g.pays), None)
    if first is None:
        return f"speculation pays at every raced level ({how})"
    users = users_text(first.users)
    if first.loses:
        return f"speculation stops paying at {users} at once on this host ({how})"
    shown = [g.users for g in gains if g.users < first.users]
    upto = f"up to {users_text(max(shown))}" if shown else "at no raced level"
    return (
        f"speculation is shown to pay {upto}; at {users} at once the race did not tell it apart from no "
        f"speculation, so where it stops paying is not shown ({how})"
    )


def race_loads(
    ctx: StudyInputs,
    study: optuna.Study,
    name: str,
    levels: tuple[int, ...],
    launch_s: float | None,
    progress: Progress,
) -> dict[int, RaceResult | None]:
    """``tuner export``'s load classes raced under the host's measuring lock (study ``name``), each level's
    verdict printed."""
    with hostlock.measuring(name, progress=progress):  # one measurement per host
        races = race_levels(ctx, study, levels, progress, launch_s)
    for users, race in races.items():
        lines = (
            verdict_lines(race)
            if race is not None
            else [
                f"{race_title(users)}: the baseline is the only finalist at {users_text(users)}; nothing to race"
            ]
        )
        for line in lines:
            print(line)
    return races
