"""Coordination through Optuna's storage: opening it, heartbeats, the shared budget tally, the SQLite lock.

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
- The baseline runs once (``tuner.run.study_loop``, the study layer, elects it and runs the loop).
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
from typing import IO

import optuna
from optuna.trial import TrialState

from tuner.errors import UserError
from tuner.measurement.failures import FailureReason
from tuner.progress import Progress
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


def fail_orphans(study: optuna.Study, workers: WorkersSpec, progress: Progress) -> None:
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
    from tuner.storage.outage import FULL, cannot_open, is_down, retrying

    try:  # a full disk is an outage, retried like one (then outage.guard says it, exit 69); a wrong URL is not
        return retrying(lambda: open_storage(url, workers), url, workers.storage_retry_s, only=FULL)
    except Exception as err:  # sqlalchemy raises many kinds; all mean "cannot use this URL"
        if is_down():
            raise
        raise cannot_open(err, url) from err
