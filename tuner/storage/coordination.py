"""Coordination through Optuna's storage: opening it, heartbeats, the shared budget, one baseline.

A study run alone (``tuner run``) and ``tuner worker`` on several hosts use the same
rules; Optuna's RDB storage is the only coordination:

- Heartbeats: a running trial records one every ``workers.heartbeat_s``; a trial without
  one for ``workers.grace_s`` belongs to a dead worker. The next worker that looks fails
  it (Optuna's ``fail_stale_trials``) and queues its parameters again, at most
  ``workers.max_retry`` times (Optuna's retry callback). Such a trial has no
  ``failure_reason``: its worker died before it could write one.
- The budget counts finished trials except those failed as interrupted (Ctrl-C measured
  nothing), those a retry replaced (the retry counts instead) and sentinels (the
  baseline re-measured, on top of the budget), so nothing counts twice. A worker starts
  a trial only while counted plus running trials are below the budget, waits while the rest runs elsewhere (a trial that dies there comes back as a
  retry, which it then runs), and stops once the budget is counted. Two workers passing
  that check in the same instant may each start one: at most workers-1 over.
- The baseline runs once: the process that created the study runs it, the others wait
  for its reference up to ``workers.baseline_wait_s``. If the baseline's worker dies, the
  worker that fails the stale trial runs its retry. A baseline that failed or was
  interrupted runs again in the next process to start.
- SQLite takes one process per study: a lock beside the database refuses a second, and
  ``tuner worker`` refuses SQLite (a database file is not safely shared across hosts).
  Under that lock a RUNNING trial is a dead process's: ``fail_orphans`` fails it at once
  with reason ``orphaned`` and says so.
- One host measures one thing at a time whatever the study or storage: see
  ``tuner.machine.hostlock``. Storage outages are retried, then stop the run with the measured
  trials kept in a local journal: see ``tuner.storage.outage`` and ``tuner.storage.journal``.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import time
import warnings
from dataclasses import dataclass, replace
from typing import IO, Callable

import optuna
from optuna.trial import TrialState

from tuner.context import StudyContext
from tuner.errors import UserError
from tuner.measurement.failures import FailureReason
from tuner.search.space import baseline_config, enqueue_params
from tuner.storage import store
from tuner.storage.records import Failure
from tuner.storage.urls import check_scheme, safe_url, scrub, sqlite_path, with_driver  # noqa: F401 (re-exported)
from tuner.studyfile.spec import WorkersSpec

SCHEMA_ATTEMPTS = 3  # workers starting together on a fresh database race to create its tables


def worker_id() -> str:
    """Who runs a trial: recorded with every trial and as the study's creator."""
    return f"{socket.gethostname()}:{os.getpid()}"


class RetryStaleTrial(optuna.storages.RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a dead worker's trial, noting which worker queued it again:
    that worker, and only that one, runs a queued-again baseline (see ``ensure_baseline``)."""

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        trial.user_attrs = store.requeue_attrs(trial, worker_id())
        super().__call__(study, trial)


def retry_callback(workers: WorkersSpec) -> RetryStaleTrial:
    """Queue a dead worker's trial again, at most ``workers.max_retry`` times."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RetryStaleTrial(max_retry=workers.max_retry)


def failed_elsewhere(study: optuna.Study, trial: optuna.Trial, workers: WorkersSpec) -> str | None:
    """None while ``trial`` is still this process's to store; else one line saying that another worker
    failed it as dead (no heartbeat for ``grace_s``, e.g. while this process was paused or starved)
    and whether it was queued again. Its measurement here is then dropped: the configuration is
    measured again from the queue (or not, past ``max_retry``), so storing this one as well, or
    journalling it for a replay, would count one configuration twice in the budget and the samplers."""
    from tuner.storage.outage import classify

    try:
        state = study._storage.get_trial(trial._trial_id).state
    except (
        Exception
    ) as err:  # an outage: the trial is taken as still ours, so the journal keeps its measurement
        if classify(err) is None:
            raise
        return None
    if state == TrialState.RUNNING:
        return None
    retry = next(
        (
            t
            for t in study.get_trials(deepcopy=False)
            if trial.number in t.system_attrs.get("retry_history", ())
        ),
        None,
    )
    where = (
        f"queued again as trial {retry.number}"
        if retry is not None
        else "not queued again (workers.max_retry reached)"
    )
    return (
        f"trial {trial.number} was failed as dead by another worker while this one did not send heartbeats for "
        f"workers.grace_s ({workers.grace_s} s; paused?) and was {where}; its measurement here is dropped, not "
        "stored or journalled, so the configuration counts once; going on with the next trial"
    )


def open_storage(url: str, workers: WorkersSpec) -> optuna.storages.RDBStorage:
    """An RDB storage with heartbeats, retried through outages (``tuner.storage.outage``); retried
    when workers race to create a fresh schema."""
    import sqlalchemy.exc  # an optuna dependency; lazy like the rest of the database side

    from tuner.storage.outage import ResilientRDBStorage

    display = url
    url = with_driver(url)
    engine_kwargs = None if url.startswith("sqlite") else {"pool_pre_ping": True}
    attempt = 1
    while True:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = ResilientRDBStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=workers.heartbeat_s,
                    grace_period=workers.grace_s,
                    heartbeat_stale_trial_callback=retry_callback(workers),
                )
                storage.retry_s = workers.storage_retry_s
                storage.display_url = display
                return storage
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            if attempt == SCHEMA_ATTEMPTS:
                raise
            time.sleep(0.5 * attempt)
            attempt += 1


def fail_stale(study: optuna.Study) -> None:
    """Fail (and maybe queue again) trials whose worker stopped sending heartbeats."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


@dataclass(frozen=True)
class Tally:
    counted: int  # finished trials that count toward the budget
    running: int  # running in any worker (or left running by a dead one, until failed)


def tally(study: optuna.Study) -> Tally:
    """Where the budget stands across all workers (see the module docstring)."""
    trials = study.get_trials(deepcopy=False)
    replaced = {n for t in trials for n in t.system_attrs.get("retry_history", ())}
    counted = sum(
        1
        for t in trials
        if t.state.is_finished()
        and t.number not in replaced
        and store.failure_reason(t) != FailureReason.INTERRUPTED.value
        and store.role_of(t) != "sentinel"
    )
    return Tally(counted=counted, running=sum(1 for t in trials if t.state == TrialState.RUNNING))


def prepare_sqlite_dir(url: str) -> None:
    """Create a SQLite file's folder; one that cannot be created is a one-line error."""
    db = sqlite_path(url)
    if db is None:
        return
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"storage {url}: cannot create the folder {db.parent} ({err.strerror}); "
            "check the path of the SQLite file"
        ) from None


def hold_sqlite_study(url: str, name: str) -> IO | None:
    """One process per SQLite study: an exclusive lock beside the database file.

    The kernel drops the lock when the process ends however it ends, so a killed run
    never blocks the next one. Returns the open lock file (None for other storages).
    Who holds it is written into it when the disk has room (a full disk still locks).
    """
    db = sqlite_path(url)
    if db is None:
        return None
    prepare_sqlite_dir(url)
    path = db.with_name(f"{db.name}.{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.lock")
    try:
        lock = open(path, "a+")
    except OSError as err:
        raise UserError(
            f"storage {url}: cannot open the study lock {path} ({err.strerror}); "
            "check the folder's permissions and free space"
        ) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise UserError(
            f"study {name!r} in {db} is being run by {holder}; a SQLite study takes one process at a time "
            "(two measured runs on one host measure each other): wait for it or stop it, or share the study "
            "across hosts with PostgreSQL and `tuner worker`"
        ) from None
    try:
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        lock.flush()
    except OSError:
        pass  # a full disk: the lock holds all the same, its holder is just not named
    return lock


def fail_orphans(study: optuna.Study, workers: WorkersSpec, progress: Callable[[str], None] = print) -> None:
    """Under the SQLite lock a running trial can only be a dead process's: fail it now, with
    reason ``orphaned``, and queue it again like a stale one, rather than after the heartbeat grace."""
    retry = retry_callback(workers)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        record = store.read_trial(trial)
        store.write_finished_record(
            study,
            trial,
            replace(record, state="FAIL", failure=Failure(store.ORPHANED, "the process running it died")),
        )
        study.tell(trial.number, state=TrialState.FAIL)
        retry(study, study.get_trials()[trial.number])
        again = (
            "queued again"
            if len(trial.system_attrs.get("retry_history", ())) < workers.max_retry
            else "not queued again (workers.max_retry reached)"
        )
        progress(
            f"trial {trial.number} ({record.role}) was left running by a process that died: failed as "
            f"orphaned, {again}"
        )


def make_storage(url: str, workers: WorkersSpec = WorkersSpec()) -> optuna.storages.BaseStorage:
    """An RDB storage with heartbeats; an unreachable URL is a one-line error, not a traceback."""
    check_scheme(url)
    prepare_sqlite_dir(url)
    from tuner.storage.outage import FULL, is_down, retrying

    try:  # a full disk is an outage, retried like one (then outage.guard says it, exit 69); a wrong URL is not
        return retrying(lambda: open_storage(url, workers), url, workers.storage_retry_s, only=FULL)
    except Exception as err:  # sqlalchemy raises many kinds; all mean "cannot use this URL"
        if is_down():
            raise
        first = scrub(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__, url)
        fix = (
            "install the PostgreSQL driver: pip install -e '.[postgres]'"
            if isinstance(err, ImportError) and url.startswith("postgresql")
            else "check the URL and that the database is reachable"
        )
        raise UserError(f"storage {safe_url(url)}: cannot open ({first}); {fix}") from err


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
    study: optuna.Study, ctx: StudyContext, run_one: Callable[[], None], progress: Callable[[str], None]
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
            store.enqueue(study, dict(item), "warm_start", skip_if_exists=True)


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
    study: optuna.Study, ctx: StudyContext, run_one: Callable[[], None], progress: Callable[[str], None]
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
    progress: Callable[[str], None],
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
