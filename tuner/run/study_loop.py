"""The study's loop on this host: the study opened or joined (its record written once), the baseline
first (elected across workers), then trials until the budget counts.

Lifecycle of ``run_study``:
1. ``prepare`` reads the models' GGUF headers, refuses incompatible drafts, resolves
   the search space for this machine, loads the workload and takes the fingerprint;
   nothing is written before all of it succeeded.
2. ``open_study`` creates or resumes the Optuna study. A new study records the
   ``StudyRecord`` (fingerprint, build, models, space, workload, measurement and scorer);
   a resumed one is refused, with one line naming what changed, if its numbers would no
   longer be comparable.
3. The baseline trial (target alone, default experts, greedy, default threads) runs
   first, once across all workers; its outputs become the quality reference and its
   tokens/s the speedup base. Warm-start configurations are enqueued after it.
4. The sampler proposes the rest until the budget (trials and/or minutes) is spent;
   the budget counts finished trials (not interrupted ones, a retried one once), so a
   resumed study just continues. Each trial is this process's ``run/objective.ProcessTrials.run_one``.

The baseline runs once: the process that created the study runs it, the others wait for its
reference up to ``workers.baseline_wait_s``. If the baseline's worker dies, the worker that fails
the stale trial runs its retry. A baseline that failed or was interrupted runs again in the next
process to start. Trials then run while counted plus running trials are below the budget (see
``tuner.storage.coordination`` for the tally and heartbeats it rests on). Why here and not in
storage: the loop needs the study's context and its search space; storage only opens, reads,
writes, locks and beats hearts.

One measured trial at a time: two llama.cpp runs on one box measure each other. More
hosts share one study through PostgreSQL (``tuner worker``, see ``tuner.storage.coordination``).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from tuner.decisions.race import race_study, verdict_lines
from tuner.errors import UserError
from tuner.eta import RunClock
from tuner.machine import hostlock
from tuner.prepare import StudyContext, prepare, study_estimate
from tuner.progress import Progress
from tuner.run.objective import ProcessTrials
from tuner.search.prior import describe_prior, find_prior
from tuner.search.sampling import sampler_for
from tuner.search.space import baseline_config, enqueue_params, with_followers
from tuner.storage import outage, store
from tuner.storage.coordination import (
    fail_orphans,
    fail_stale,
    hold_sqlite_study,
    make_storage,
    safe_url,
    tally,
    worker_id,
)
from tuner.storage.journal import Journal
from tuner.storage.records import Failure, StudyRecord, changes
from tuner.studyfile.spec import StudySpec, WorkersSpec

INIT_WAIT_S = 10.0  # how long a joining worker waits for the study's creator to record the study


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


def open_study(ctx: StudyContext) -> optuna.Study:
    """Create or resume; refuse to add trials whose numbers would not compare with the stored ones.

    Of several workers starting at once exactly one creates the study (and later runs the
    baseline, see ``tuner.storage.coordination``); the others wait for it to record the study.
    """
    spec = ctx.spec
    storage = make_storage(spec.storage, spec.workers)
    directions = [optuna.study.StudyDirection[o.direction.upper()] for o in spec.objectives]
    try:  # creation is atomic: with several workers starting at once, exactly one creates
        study = optuna.create_study(
            study_name=spec.name, storage=storage, directions=directions, sampler=make_sampler(spec)
        )
        store.set_created_by(study, worker_id())
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=spec.name, storage=storage, sampler=make_sampler(spec))
    if list(study.directions) != directions:
        raise UserError(
            f"{spec.path}: objectives: study {spec.name!r} exists with other objective directions; use a new name"
        )
    waited = time.monotonic() + INIT_WAIT_S
    while (
        not store.has_study_record(study)
        and store.created_by(study) != worker_id()
        and time.monotonic() < waited
    ):
        time.sleep(0.2)  # joining a study whose creator is recording it right now
    if not store.has_study_record(study):  # created here, or its creator died before recording it
        store.set_created_by(study, worker_id())
        record = ctx.study_record(worker_id())
        store.write_study_record(study, record)
        prior = (
            find_prior(storage, record, ctx.space) if spec.reuse and spec.sampler == "structured" else None
        )
        if prior:
            store.write_prior(study, prior)
        return study
    refuse_incomparable(ctx, store.read_study_record(study))
    return study


def refuse_incomparable(ctx: StudyContext, stored: StudyRecord) -> None:
    """One line naming what changed since the study was stored, and how to start a new one."""
    changed = changes(stored, ctx.study_record(stored.created_by))
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise UserError(
            f"{ctx.spec.path}: study {ctx.spec.name!r} exists and its {changed[0]}{more}: new trials would not "
            f"compare with its stored ones; revert the change, or start a new study by changing `name:`"
        )


def make_sampler(spec: StudySpec) -> optuna.samplers.BaseSampler:
    return sampler_for(spec.sampler, spec.seed, spec.budget_trials)


def _baselines(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if store.role_of(t) == "baseline"]


def _baseline_pending(study: optuna.Study, workers: WorkersSpec) -> bool:
    """A baseline runs or is queued somewhere, or its worker died and the worker that
    noticed is queueing it again this instant (failed without a reason, retries left)."""
    trials = study.get_trials(deepcopy=False)
    replaced = {n for t in trials for n in t.system_attrs.get("retry_history", ())}
    return any(
        t.state in (TrialState.RUNNING, TrialState.WAITING)
        or (
            t.state == TrialState.FAIL
            and store.failure_reason(t) is None
            and t.number not in replaced
            and len(t.system_attrs.get("retry_history", ())) < workers.max_retry
        )
        for t in trials
        if store.role_of(t) == "baseline"
    )


def _baseline_failed(study: optuna.Study, ctx: StudyContext) -> UserError:
    last = store.read_trial(_baselines(study)[-1])
    failure = last.failure or Failure("its worker died", "")
    return UserError(
        f"the baseline trial {last.number} failed ({failure.reason}: {failure.detail}); "
        f"fix it before tuning (log in {ctx.log_dir})"
    )


def ensure_baseline(
    study: optuna.Study, ctx: StudyContext, run_one: Callable[[], None], progress: Progress
) -> None:
    """Return once the study has its reference: run the baseline here, or wait for it.

    Runs it here when this process created the study, when an earlier baseline failed
    or was interrupted, or for a study from before workers existed; otherwise waits for
    the worker running it. Nothing else is queued before the reference exists, so
    ``run_one`` pops the baseline. The process that ran it queues the warm starts.
    """
    if store.read_reference(study):
        return
    creator = store.created_by(study)
    if _requeued_here(study):  # its worker died and this one queued it again: this one runs it
        run_one()
    elif creator in (None, worker_id()) or (
        _baselines(study) and not _baseline_pending(study, ctx.spec.workers)
    ):
        store.enqueue(study, enqueue_params(baseline_config(ctx.space), ctx.space), "baseline")
        run_one()
    else:
        _wait_for_baseline(study, ctx, run_one, progress)
    if not store.read_reference(study):
        raise _baseline_failed(study, ctx)
    if any(r.complete and r.worker == worker_id() for r in map(store.read_trial, _baselines(study))):
        for item in ctx.spec.warm_start:
            store.enqueue(study, with_followers(dict(item), ctx.space), "warm_start", skip_if_exists=True)


def _requeued_here(study: optuna.Study) -> bool:
    """A baseline this worker queued again after its worker died (this one runs it)."""
    return any(
        t.state == TrialState.WAITING and store.requeued_by(t) == worker_id() for t in _baselines(study)
    )


def worker_gone(worker: str | None) -> bool:
    """Whether ``worker`` (HOST:PID) ran on this host and its process has exited."""
    host, _, pid = (worker or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _wait_for_baseline(
    study: optuna.Study, ctx: StudyContext, run_one: Callable[[], None], progress: Progress
) -> None:
    workers = ctx.spec.workers
    deadline = time.monotonic() + workers.baseline_wait_s
    creator = store.created_by(study)
    if worker_gone(creator):
        progress(
            f"waiting for the baseline trial: the worker that created the study ({creator}) ran on this host "
            f"and has exited; its trial is failed after {workers.grace_s} s without a heartbeat and runs here"
        )
    else:
        progress(f"waiting for the baseline trial, run by the worker that created the study ({creator})")
    while not store.read_reference(study):
        fail_stale(study)
        baselines = _baselines(study)
        if _requeued_here(study):  # its worker died and this one queued it again: this one runs it
            run_one()
            return
        if baselines and not _baseline_pending(study, workers):
            return  # it failed: the caller reports why
        if time.monotonic() > deadline:
            raise UserError(
                f"no baseline after {workers.baseline_wait_s:g} s: the worker that created study "
                f"{ctx.spec.name!r} ({store.created_by(study)}) runs it first; check that it is "
                "running, or raise workers.baseline_wait_s"
            )
        time.sleep(poll_interval(workers))


def poll_interval(workers: WorkersSpec) -> float:
    return min(5.0, float(workers.heartbeat_s))


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
