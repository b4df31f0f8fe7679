"""Storage outages: retried for a bounded time, then one line and a non-zero exit.

Every call the tuner (and Optuna on its behalf) makes to an RDB storage goes through
``ResilientRDBStorage``: an error that can pass (a connection refused or dropped, a
database server restarting, a full disk, a locked SQLite file) is retried with backoff for
up to ``workers.storage_retry_s`` (one message on stderr when it starts). When the time is
up, or at once for an error that cannot pass (a read-only database), the storage is
*down* for the rest of the process: every later call fails at once, and ``guard`` turns
whatever Optuna raised on its way out into one ``StorageUnavailable`` line naming the
journal (``tuner.storage.journal``) that keeps the measured trials for the next run.

A damaged SQLite file ("database disk image is malformed", "file is not a database") is no
outage: it will not pass, so the storage is down at once, and ``damaged_storage`` names the
file and how to restore or recover it, in one line, from wherever the error surfaced.

The heartbeat thread never dies of an outage: a heartbeat that cannot be recorded is
skipped (the next one, ``heartbeat_s`` later, tries again).
"""

from __future__ import annotations

import sys
import time
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote

from optuna.storages import RDBStorage

from tuner.errors import UserError
from tuner.storage.urls import safe_url, scrub, sqlite_files_used

_down: "StorageDown | None" = None  # the process's storage outage, once retries ran out


class StorageDown(Exception):
    """Raised by every storage call once the storage is down (caught by ``guard``)."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem


class StorageUnavailable(UserError):
    """The storage stayed unavailable: measured trials are in the journal."""

    exit_code = 69  # EX_UNAVAILABLE


class StorageDamaged(StorageUnavailable):
    """The SQLite file is damaged or not a database: restore it or recover it."""


DAMAGED = ("database disk image is malformed", "file is not a database")  # SQLite's words for a damaged file


def _damage(err: BaseException) -> str | None:
    """SQLite's own words if ``err`` (or what caused it) says the database file is damaged."""
    import sqlite3

    for link in _cause_chain(err):
        if isinstance(link, sqlite3.DatabaseError):
            return next((words for words in DAMAGED if words in str(link)), None)
    return None


def _damaged_file() -> Path | None:
    """Which of the SQLite files this process opened fails SQLite's own check (the last one if none does)."""
    import sqlite3

    files = sqlite_files_used()
    for path in files:
        try:
            with closing(sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)) as db:
                if db.execute("PRAGMA quick_check(1)").fetchone() != ("ok",):
                    return path
        except sqlite3.DatabaseError:
            return path
    return files[-1] if files else None


def damaged_storage(err: BaseException) -> StorageDamaged | None:
    """One line for a damaged SQLite file anywhere in ``err``'s causes (None if that is not what happened)."""
    if isinstance(err, StorageUnavailable):
        return None  # already said in one line
    words = _damage(err)
    if words is None:
        return None
    path = _damaged_file() or "the SQLite file"
    what = (
        "the SQLite file is damaged"
        if words == DAMAGED[0]
        else "not a SQLite file, or one whose header is damaged"
    )
    return StorageDamaged(
        f"storage {path}: {words} ({what}); restore it from a backup, or salvage what SQLite can "
        f"still read with `sqlite3 {path} .recover` (or `.dump`) into a new file and use that as the storage"
    )


def _cause_chain(err: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    seen: set[int] = set()
    link: BaseException | None = err
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


def classify(err: BaseException) -> str | None:
    """'transient', 'permanent' (a storage problem that will not pass), or None (not an outage)."""
    import sqlalchemy.exc

    for link in _cause_chain(err):
        if isinstance(link, sqlalchemy.exc.IntegrityError):
            return None  # a race between workers, handled where it happens
        if isinstance(
            link,
            (
                sqlalchemy.exc.OperationalError,
                sqlalchemy.exc.InterfaceError,
                sqlalchemy.exc.PendingRollbackError,
                sqlalchemy.exc.TimeoutError,
            ),
        ) or (isinstance(link, sqlalchemy.exc.DBAPIError) and link.connection_invalidated):
            if _damage(link) is not None:
                return "permanent"
            return (
                "permanent" if "readonly database" in str(link) or "read-only" in str(link) else "transient"
            )
    return None


def problem_of(err: BaseException, url: str) -> str:
    """One line about a storage error, password removed."""
    import sqlalchemy.exc

    for link in _cause_chain(err):
        if isinstance(link, sqlalchemy.exc.DBAPIError) and link.orig is not None:
            err = link.orig
            break
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return scrub(text, url)


def cannot_open(err: BaseException, url: str) -> UserError:
    """The one line for a storage that cannot be opened (any command, any error its driver raised):
    the URL and the problem with the password hidden, and the fix (a missing PostgreSQL driver named)."""
    fix = (
        "install the PostgreSQL driver: pip install -e '.[postgres]'"
        if isinstance(err, ImportError) and url.startswith("postgresql")
        else "check the URL and that the database is reachable"
    )
    return UserError(f"storage {safe_url(url)}: cannot open ({problem_of(err, url)}); {fix}")


FULL = (
    "database or disk is full",
    "No space left on device",
    "could not extend file",
)  # SQLite, OS, PostgreSQL


def is_down() -> bool:
    return _down is not None


def retrying(call: Callable[[], Any], url: str, retry_s: float, only: tuple[str, ...] = ()) -> Any:
    """``call()``, retried with backoff through a transient outage for ``retry_s`` (one message when
    retrying starts); then, or at once for a permanent one, the storage is down. ``only``: retry only
    errors whose message has one of these phrases, and raise any other as it is."""
    global _down
    if _down is not None:
        raise _down
    deadline = None
    delay = 0.5
    while True:
        try:
            return call()
        except Exception as err:
            kind = classify(err)
            problem = problem_of(err, url)
            if kind is None or _down is not None or (only and not any(words in problem for words in only)):
                raise  # not an outage (or not one to retry here), or a nested call already ran out of time
            now = time.monotonic()
            if deadline is None and kind == "transient" and retry_s > 0:
                deadline = now + retry_s
                print(
                    f"storage {safe_url(url)}: {problem}; retrying for up to {retry_s:g} s",
                    file=sys.stderr,
                    flush=True,
                )
            if deadline is None or now >= deadline:
                _down = StorageDown(problem)
                raise _down from err
            time.sleep(min(delay, max(0.0, deadline - now)))
            delay = min(delay * 2, 5.0)


class ResilientRDBStorage(RDBStorage):
    """Optuna's RDB storage, each call retried through an outage (see the module docstring)."""

    retry_s: float = 120.0
    display_url: str = ""

    def _call(self, method: Callable, *args: Any, **kwargs: Any) -> Any:
        return retrying(lambda: method(*args, **kwargs), self.display_url, self.retry_s)

    def record_heartbeat(self, trial_id: int) -> None:
        """Optuna's heartbeat thread ends at its first exception: a missed heartbeat is skipped instead."""
        if _down is not None:
            return
        try:
            super().record_heartbeat(trial_id)
        except Exception:  # the next heartbeat tries again; a long outage fails the trial as stale elsewhere
            pass


_RETRIED = (
    "create_new_study",
    "delete_study",
    "set_study_user_attr",
    "set_study_system_attr",
    "get_study_id_from_name",
    "get_study_name_from_id",
    "get_study_directions",
    "get_study_user_attrs",
    "get_study_system_attrs",
    "get_trial_user_attrs",
    "get_trial_system_attrs",
    "get_all_studies",
    "create_new_trial",
    "set_trial_param",
    "get_trial_param",
    "set_trial_state_values",
    "set_trial_intermediate_value",
    "set_trial_user_attr",
    "set_trial_system_attr",
    "get_trial_id_from_study_id_trial_number",
    "get_trial_number_from_id",
    "get_trial",
    "get_all_trials",
    "get_n_trials",
    "get_best_trial",
    # Optuna's trial cache calls these private ones directly (without _create_new_trial a full disk on
    # resume stopped the run at its first trial, after SQLite's own lock timeout, not after storage_retry_s)
    "_get_stale_trial_ids",
    "_get_trials",
    "_create_new_trial",
    "_set_trial_param",
    "_get_best_trial_id",
)


def _retried(name: str) -> Callable:
    base = getattr(RDBStorage, name)

    def method(self: ResilientRDBStorage, *args: Any, **kwargs: Any) -> Any:
        return self._call(base, self, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = base.__doc__
    return method


for _name in _RETRIED:
    if hasattr(RDBStorage, _name):
        setattr(ResilientRDBStorage, _name, _retried(_name))


def reset() -> None:
    """A new run starts with its storage up (tests run several in one process)."""
    global _down
    _down = None


@contextmanager
def guard(url: str, kept: Callable[[], tuple[int, str]]) -> Iterator[None]:
    """Turn an outage, however Optuna surfaced it, into one line; ``kept()`` is
    (measured trials not yet in storage, the journal holding them)."""
    reset()
    try:
        yield
    except (KeyboardInterrupt, StorageUnavailable):
        raise
    except Exception as err:
        damaged = damaged_storage(err)
        if damaged is not None:
            raise StorageDamaged(f"{damaged}; {_kept_text(kept)}") from None
        if _down is None and (isinstance(err, UserError) or classify(err) is None):
            raise  # not an outage, or already one line (a storage that cannot be opened at all says how to fix its URL)
        problem = _down.problem if _down is not None else problem_of(err, url)
        raise StorageUnavailable(_unavailable(url, problem, kept)) from None


def _kept_text(kept: Callable[[], tuple[int, str]]) -> str:
    count, journal = kept()
    return (
        f"{count} measured trial(s) kept in {journal}, run again to store them"
        if count
        else "no measured trial is waiting to be stored"
    )


def _unavailable(url: str, problem: str, kept: Callable[[], tuple[int, str]]) -> str:
    return f"storage unavailable: {safe_url(url)}: {problem}; {_kept_text(kept)}"
