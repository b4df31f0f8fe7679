"""A study's start, once across its workers: the study created and recorded by one of them (a resume whose
numbers would not compare refused), then its baseline run by one and waited for by the others. Why a module
of its own: who does what when several workers start one study is one concern, apart from the loop that
then runs trials until the budget counts (``run/study_loop``).

The baseline runs once: the process that created the study runs it, the others wait for its
reference up to ``workers.baseline_wait_s``. If the baseline's worker dies, the worker that fails
the stale trial runs its retry. A baseline that failed or was interrupted runs again in the next
process to start. Why here and not in storage: the start needs the study's context and its search
space; storage only opens, reads, writes, locks and beats hearts (``tuner.storage.coordination``).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from tuner.errors import UserError
from tuner.prepare import StudyContext
from tuner.progress import Progress
from tuner.search.prior import find_prior
from tuner.search.sampling import sampler_for
from tuner.search.space import baseline_config, enqueue_params, with_followers
from tuner.storage import store
from tuner.storage.coordination import fail_stale, make_storage, worker_id
from tuner.storage.records import Failure, StudyRecord, changes
from tuner.studyfile.spec import StudySpec, WorkersSpec

INIT_WAIT_S = 10.0  # how long a joining worker waits for the study's creator to record the study


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
