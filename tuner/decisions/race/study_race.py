"""A study's race: its finalists (or the given candidates) raced against its baseline on real launches
(``launching.run_race``), each launch sized from the study's sentinels, the result stored with the study."""

from __future__ import annotations

import optuna

from tuner.decisions import launch_size
from tuner.decisions.drift import Sentinels
from tuner.decisions.race.finalist_launches import RaceSetup
from tuner.decisions.race.finalist_selection import finalists
from tuner.decisions.race.real_race import run_race
from tuner.decisions.race.results import RaceResult
from tuner.decisions.remeasure import StudyInputs
from tuner.progress import Progress
from tuner.storage import store
from tuner.storage.records import TrialRecord


def race_study(
    ctx: StudyInputs,
    study: optuna.Study,
    progress: Progress,
    candidates: list[TrialRecord] | None = None,
    launch_s: float | None = None,
    users: int | None = None,
) -> RaceResult | None:
    """Race a study's finalists (or the given candidates) against its baseline; stored with the study.
    None when there is nothing to race: no feasible trial other than the baseline itself. ``launch_s``:
    a launch as the study's estimate has it, for the remaining time before the first is measured. With
    ``users``, the load class of that many users at once (``tuner.decisions.load_race``), stored as its own."""
    base = store.baseline_record(study)
    if base is None:
        return None
    records = store.read_trials(study)
    pool = (
        candidates
        if candidates is not None
        else finalists(records, ctx.settings.noise_cv, ctx.spec.race.max_finalists, users)
    )
    pool = [r for r in pool if r.config != base.config]
    if not pool:
        return None
    if progress.time.unit_s is None:  # no trial measured in this command: a launch as the study estimates it
        progress.time.unit_s = launch_s
    sentinels = Sentinels(records, ctx.settings.noise_cv)
    size = (
        launch_size.from_trials(
            [*pool, base], sentinels.launch_estimate(), ctx.workload, ctx.spec.race.max_rounds
        )
        if users is None
        else None
    )
    setup = RaceSetup(
        workload=ctx.workload,
        settings=ctx.settings,
        spec=ctx.spec.race,
        log_dir=ctx.log_dir,
        launch_sigma=sentinels.launch_estimate(),  # the forecast before racing: a point estimate, not a bound
        users=users,
        size=size,
    )
    result = run_race(store.read_study_record(study), pool, base, setup, progress)
    if users is None:
        store.write_race(study, result.to_json())
    else:
        store.write_load_race(study, users, result.to_json())
    return result
