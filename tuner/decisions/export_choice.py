"""What ``tuner export`` deploys, decided before a file is written: one value (``Deployment``).

``decide`` takes the study as recorded (``Recorded``), what the operator asked (``ExportRequest``) and the
study's context to race with, and returns the pooled choice (the policy's, raced against the baseline and
the other finalists: ``deployment.race_for_export``), the content types whose own winner pays on held-out
prompts (``deployment.race_types``) and one configuration per load class (``load_race.race_loads``, or the
best recorded figure with ``--no-race``). It prints each decision as it is made; ``tuner.output.export``
writes the value as files.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna
import pandas as pd

from tuner.decisions.load_race import race_loads
from tuner.decisions.per_type import PerTypeResult
from tuner.decisions.race import RaceResult, verdict_lines
from tuner.decisions.remeasure import StudyInputs
from tuner.decisions.route import section_name
from tuner.decisions.trial_selection import (
    best_at_load,
    choose,
    race_for_export,
    race_policy,
    race_types,
    wants_per_type,
)
from tuner.knobs.config import method_of
from tuner.progress import Progress
from tuner.storage import store
from tuner.storage.records import StudyRecord, TrialRecord


@dataclass(frozen=True)
class ExportRequest:
    """What the operator asked of an export (``tuner export``'s options)."""

    policy: str = "max-tps"
    min_acceptance: float | None = None
    trial: int | None = None  # --trial: this feasible trial instead of the policy's choice
    no_race: bool = False
    per_type: bool | None = None  # --per-type True, --no-per-type False, else None (the study decides)
    concurrency: tuple[int, ...] | None = None  # the load classes asked for, else None (those measured)


@dataclass(frozen=True, eq=False)
class Recorded:
    """The study as its records say, as a deployment reads it: the trials as a frame (``output.analysis``'s
    ``trials_frame``), the content types and load levels measured, and each type's recorded best (printed
    beside the choice)."""

    study: optuna.Study
    record: StudyRecord
    records: list[TrialRecord]
    frame: pd.DataFrame
    suites: list[str]
    levels: list[int]
    per_suite: list[dict]


@dataclass(frozen=True)
class Deployed:
    """One deployed configuration: its trial, why it is deployed (one line), its race if it was raced, its
    preset section's name ("" for the study's own) and, for a load class, the slots it is served with."""

    trial: TrialRecord
    policy: str
    race: RaceResult | None = None
    section: str = ""
    slots: int | None = None


@dataclass(frozen=True)
class Deployment:
    """The study's deployment: the pooled winner, the per-type race and the types that pay, the load classes.
    ``router``: per-type or load sections were decided on, so a router serves them (even when none pays)."""

    pooled: Deployed
    type_race: PerTypeResult | None = None
    per_type: tuple[Deployed, ...] = ()
    by_load: tuple[Deployed, ...] = ()
    router: bool = False

    @property
    def load_races(self) -> dict[int, RaceResult]:
        """The load classes that were raced, by users."""
        return {d.slots: d.race for d in self.by_load if d.slots is not None and d.race is not None}


def decide(
    recorded: Recorded, request: ExportRequest, ctx: StudyInputs | None, progress: Progress
) -> Deployment:
    """Choose and race the study's deployment: pooled, per content type and per load class (``ctx`` None: not
    raced; ``progress.time.unit_s``: one launch's expected seconds)."""
    pooled = _pooled(recorded, request, ctx, progress)
    type_race: PerTypeResult | None = None
    per_type: tuple[Deployed, ...] = ()
    router = False
    if wants_per_type(request.per_type, request.no_race, recorded.record, recorded.suites):
        assert ctx is not None, "per-type winners are raced, so the export has the study's context"
        type_race, per_type = _per_type(recorded, request.per_type, pooled, ctx, progress)
        router = True
    levels = load_levels(recorded.levels, request.concurrency)
    races = None
    if levels and ctx is not None:
        races = race_loads(ctx, recorded.study, recorded.record.name, levels, progress.time.unit_s, progress)
    by_load = _by_load(recorded, levels, races)
    return Deployment(pooled, type_race, per_type, by_load, router or bool(by_load))


def _pooled(
    recorded: Recorded, request: ExportRequest, ctx: StudyInputs | None, progress: Progress
) -> Deployed:
    """The policy's choice, raced (unless --no-race) against the baseline and the other finalists."""
    study, record = recorded.study, recorded.record
    number, why = choose(record, recorded.frame, request.policy, request.min_acceptance, request.trial)
    chosen = store.read_trial(study.trials[number])
    metrics = chosen.measured_metrics  # the policy chooses among complete trials
    print(
        f"chosen: trial {number} ({why}): {metrics.tokens_per_second:.1f} tokens/s, "
        f"x{sentinel_speedup(chosen, recorded.frame):.2f} over the baseline (recorded, one measurement)"
    )
    race = None
    if ctx is not None:
        candidates = None if request.policy == "max-tps" and request.trial is None else [chosen]
        race = race_for_export(ctx, study, record, candidates, progress.time.unit_s, progress)
        if race is None:
            print("race: the choice is the baseline configuration itself; nothing to race")
        else:
            for line in verdict_lines(race):
                print(line)
            number, why = race.winner, race_policy(race, why)
            if not race.baseline_deployed:  # every section states the raced speedup, as the -cN sections do
                why = f"{race.figure()}; {why}"
            if race.baseline_deployed:
                print(f"export: {why}")
    deployed = store.read_trial(study.trials[number])
    if (
        race is not None
        and deployed.config.as_dict().get("spec_type", "none") != "none"
        and race.drafted.get(f"trial-{number}") == 0
    ):
        print("WARNING: the winner drafted nothing while racing: speculation was off")
    for row in recorded.per_suite:
        print(
            f"best on {row['suite']} (recorded, all its prompts): trial {row['trial']}, {row['method']}, "
            f"K={row['draft_max']}, T={row['temperature']}: {row['tokens_per_second']:.1f} tokens/s"
        )
    return Deployed(deployed, why, race)


def _per_type(
    recorded: Recorded, asked: bool | None, pooled: Deployed, ctx: StudyInputs, progress: Progress
) -> tuple[PerTypeResult | None, tuple[Deployed, ...]]:
    """Race the per-type winners on held-out prompts; the types that pay, each deployed in its own section."""
    study, record = recorded.study, recorded.record
    result = race_types(ctx, study, record, pooled.trial.number, asked, progress)
    if result is None:
        return None, ()
    pooled_section = section_name(record.name)
    deployed = tuple(
        Deployed(
            store.read_trial(study.trials[t.winner]),
            f"fastest on the {t.suite} tuning prompts; {t.why}",
            section=f"{pooled_section}-{t.suite}",
        )
        for t in result.paying
    )
    if not deployed:
        print(
            f"per-type: no type's winner beats the pooled winner beyond the noise on held-out prompts; "
            f"the router serves the pooled winner only, as {pooled_section!r}"
        )
    else:
        print(
            "per-type sections: "
            + ", ".join(section_name(d.section) for d in deployed)
            + f" (and {pooled_section!r}, the pooled winner)"
        )
    return result, deployed


def load_levels(measured: list[int], asked: tuple[int, ...] | None) -> tuple[int, ...]:
    """The load classes to export: those asked for, else every level measured when it measured more than one user."""
    return asked if asked is not None else (tuple(measured) if measured and max(measured) > 1 else ())


def _by_load(
    recorded: Recorded, levels: tuple[int, ...], races: dict[int, RaceResult | None] | None
) -> tuple[Deployed, ...]:
    """One STUDY-cN configuration per load class, served with N slots: its race's winner (``races``, by users),
    else the feasible trial with the best recorded aggregate tokens/s at N users (one launch each: the trial's
    own)."""
    deployed = []
    for users in levels:
        best, figure = best_at_load(recorded.record, recorded.frame, users, recorded.levels)
        race = (races or {}).get(users)
        trial = race.winner if race is not None else int(best["trial"])
        chosen = store.read_trial(recorded.study.trials[trial])
        assert chosen.command is not None, "a trial measured at a load was launched, so it has its command"
        if race is None:
            policy = f"best recorded aggregate tokens/s at {users} user(s): {figure:.1f}"
            how = f"{figure:.1f} tokens/s in all at {users} user(s) at once (recorded, one launch)"
        else:
            winning = race.winning
            how = (
                f"{winning.mean_tokens_per_second:.1f} tokens/s in all at {users} user(s) at once "
                f"over {len(winning.rates)} launches"
            )
            policy = f"{how}, {race.figure()}; " + race_policy(
                race, f"best aggregate tokens/s at {users} user(s)"
            )
        section = f"{section_name(recorded.record.name)}-c{users}"
        deployed.append(Deployed(chosen, policy, race, section, slots=users))
        print(
            f"load class c{users}: trial {trial}, {method_of(chosen.config.as_dict())}: {how}, served with {users} slot(s)"
        )
    return tuple(deployed)


def sentinel_speedup(trial: TrialRecord, frame: pd.DataFrame) -> float:
    """The trial's speedup over the baseline as the sentinels put it around its time (``drift.Sentinels``: a first
    baseline reading they contradicted left out), else as recorded at the time: a one-launch figure against a
    disturbed baseline is never what an exported file states."""
    rows = frame[frame["trial"] == trial.number] if "speedup" in frame.columns else frame.iloc[0:0]
    corrected = rows["speedup"].iloc[0] if len(rows) else None
    assert trial.metrics is not None, "an exported trial is complete"
    return float(corrected) if corrected is not None and not pd.isna(corrected) else trial.metrics.speedup
