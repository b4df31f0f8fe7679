"""The study's loop on this host: the study opened or joined (its record written once), the baseline
first (elected across workers), then trials until the budget counts.

Lifecycle of ``run_study``:
1. ``prepare`` reads the models' GGUF headers, refuses incompatible drafts, resolves
   the search space for this machine, loads the workload and takes the fingerprint;
   nothing is written before all of it succeeded.
2. ``open_study`` (``run/study_start``) creates or resumes the Optuna study. A new study
   records the ``StudyRecord`` (fingerprint, build, models, space, workload, measurement and scorer);
   a resumed one is refused, with one line naming what changed, if its numbers would no
   longer be comparable.
3. The baseline trial (target alone, default experts, greedy, default threads) runs
   first, once across all workers (``run/study_start.ensure_baseline``); its outputs become
   the quality reference and its tokens/s the speedup base. Warm-start configurations are
   enqueued after it.
4. The sampler proposes the rest until the budget (trials and/or minutes) is spent;
   the budget counts finished trials (not interrupted ones, a retried one once), so a
   resumed study just continues. Each trial is this process's ``run/objective.ProcessTrials.run_one``.

Trials run while counted plus running trials are below the budget (see ``tuner.storage.coordination``
for the tally and heartbeats it rests on).

One measured trial at a time: two llama.cpp runs on one box measure each other. More
hosts share one study through PostgreSQL (``tuner worker``, see ``tuner.storage.coordination``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import optuna

from tuner.decisions.race import race_study, verdict_lines
from tuner.eta import RunClock
from tuner.machine import hostlock
from tuner.prepare import StudyContext, prepare, study_estimate
from tuner.progress import Progress
from tuner.run.objective import ProcessTrials
from tuner.run.study_start import ensure_baseline, open_study, poll_interval
from tuner.search.prior import describe_prior
from tuner.storage import outage, store
from tuner.storage.coordination import fail_orphans, fail_stale, hold_sqlite_study, safe_url, tally, worker_id
from tuner.storage.journal import Journal
from tuner.studyfile.spec import StudySpec, WorkersSpec


def run_study(
    spec: StudySpec, trials: int | None = None, progress: Progress | None = None, race: bool = False
) -> optuna.Study:
    """Run or resume a study until its budget is spent, alone or as one of its workers; returns the study.

    Every ``sentinel.every_trials`` trials (or minutes) this process re-measures the baseline
    configuration first (tuner.decisions.drift). With ``race`` the finalists are raced at the end (tuner.decisions.race).
    Measures under the host's measurement lock (``tuner.machine.hostlock``); a storage outage stops
    it in one line with the measured trials kept in the journal (``tuner.storage.journal``), which
    the next run stores first. ``progress``: the run's lines (default: printed, timed from now)."""
    progress = Progress() if progress is None else progress
    ctx = prepare(spec, progress)
    journal = Journal(spec.name, spec.storage)
    with hostlock.measuring(spec.name, progress=progress), outage.guard(spec.storage, journal.pending):
        study = _run_locked(ctx, journal, trials, progress, race)
        journal.settle()
    return study


def _starting_notes(ctx: StudyContext, study: optuna.Study, progress: Progress) -> None:
    """What the space left out on this machine, and the warm start from an earlier study."""
    for note in ctx.space.notes:
        progress(f"note: {note}")
    prior = store.read_prior(study)
    if prior:
        uses = (
            [f"its {', '.join(f'{k}={v}' for k, v in prior['hardware'].items())} first in the hardware stage"]
            if prior["hardware"]
            else []
        ) + (["its winner right after the baseline"] if prior["params"] else [])
        progress(
            f"warm start from {describe_prior(prior)}: {' and '.join(uses)} (sampler.reuse: false turns it off)"
        )


def _open_for_run(ctx: StudyContext, journal: Journal, progress: Progress, lock) -> optuna.Study:
    """The study opened for this run: progress to the dashboard, the journal replayed, orphans failed."""
    study = open_study(ctx)
    progress.sink = lambda figures: store.write_progress(study, {"command": "tuner run", **figures})
    journal.replay(study, progress)  # trials measured before a storage outage, before orphans are failed
    if store.created_by(study) != worker_id():
        study.sampler.reseed_rng()  # a joining worker or a resumed run must not replay the creator's proposals
    if lock:
        fail_orphans(study, ctx.spec.workers, progress)
    return study


def _run_locked(
    ctx: StudyContext, journal: Journal, trials: int | None, progress: Progress, race: bool
) -> optuna.Study:
    """The study opened and run to its budget under the SQLite study lock (none for a database server),
    then raced; Optuna's own log lines silenced meanwhile."""
    spec = ctx.spec
    lock = hold_sqlite_study(spec.storage, spec.name)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # our progress line replaces Optuna's
    try:
        study = _open_for_run(ctx, journal, progress, lock)
        budget = trials or spec.budget_trials
        deadline = time.monotonic() + spec.budget_minutes * 60 if spec.budget_minutes else None
        clock = RunClock(progress.time, study_estimate(ctx), budget, race, deadline)
        clock.replan(tally(study).counted)
        _starting_notes(ctx, study, progress)
        process_trials = ProcessTrials(ctx, study, journal, progress, budget, clock, deadline)
        done = tally(study).counted
        progress(f"study {spec.name}: {done} of {budget} trials done; storage {safe_url(spec.storage)}")
        if done < budget:
            ensure_baseline(study, ctx, process_trials.run_one, progress)
            run_until_budget(study, process_trials.run_one, budget, spec.workers, deadline, progress)
        if race:
            result = race_study(ctx, study, progress)
            for line in (
                verdict_lines(result) if result else ["race: no feasible trial besides the baseline to race"]
            ):
                progress.out(line)  # the result, not progress
        progress.time.plan(0.0)
        progress.record(f"finished: {tally(study).counted} of {budget} trials" + (", raced" if race else ""))
    finally:
        optuna.logging.set_verbosity(verbosity)
        if lock:
            try:
                lock.close()
            except (
                OSError
            ):  # its holder line could not be flushed (a full disk): the lock is released all the same
                pass
    return study


def run_until_budget(
    study: optuna.Study,
    run_one: Callable[[], None],
    budget: int,
    workers: WorkersSpec,
    deadline: float | None,
    progress: Progress,
) -> None:
    """Run trials until ``budget`` of them count, across every worker of the study."""
    said = False
    while deadline is None or time.monotonic() < deadline:
        now = tally(study)
        if now.counted >= budget:
            return
        if now.counted + now.running < budget:
            run_one()
            said = False
            continue
        if not said:
            progress(f"{now.running} trial(s) running in other workers complete the budget: waiting for them")
            said = True
        fail_stale(study)  # a dead worker's trial comes back as a retry, which this worker then runs
        time.sleep(poll_interval(workers))
