"""One measurement per host: a lock every measuring command holds while it measures.

Two llama.cpp runs on one machine measure each other, by far more than any difference a
study looks for (evidence: docs/decisions.md#one-measurement-per-host), whatever
storage or study they belong to. So ``tuner run``, ``tuner worker``, ``tuner export``'s
re-measure, the bench (``python -m benchmarks bench``, ``record-grid``) hold one exclusive ``flock`` on one
file per host (``/tmp/llama-tuner-measure.lock``, or ``$TUNER_MEASURE_LOCK``) while they
measure. A second one waits, saying once who holds it (pid, command, study), or, with
``--no-wait``, refuses in one line. The kernel drops the lock when its holder ends however
it ends, so a killed run never blocks the next. Re-entrant within a process (the
bench runs studies inside its own hold).
"""

from __future__ import annotations

import fcntl
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tuner.errors import UserError
from tuner.progress import Progress

ENV = "TUNER_MEASURE_LOCK"
DEFAULT_PATH = Path("/tmp/llama-tuner-measure.lock")

_wait_default = True  # set from --no-wait by ``set_process_defaults``
_command = "tuner " + " ".join(sys.argv[1:2]) if sys.argv[1:2] else "tuner"
_depth = 0  # this process's nested holds


class HostBusy(UserError):
    """Another measuring command runs on this host and --no-wait was given."""

    exit_code = 75  # EX_TEMPFAIL: try again later


def lock_path() -> Path:
    return Path(os.environ.get(ENV) or DEFAULT_PATH)


def set_process_defaults(wait: bool, command: str | None) -> None:
    """Whether this process's holds wait (not ``--no-wait``), and the command (``tuner run``) named to whoever
    waits for them."""
    global _wait_default, _command
    _wait_default = wait
    _command = command or "tuner"


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's file in a sticky /tmp: locking needs no write access
        return os.open(path, os.O_RDONLY)
    except OSError as err:
        raise UserError(
            f"measurement lock {path}: cannot open ({err.strerror}); set {ENV} to a writable path"
        ) from None


def holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 4096).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "another process"


@contextmanager
def measuring(study: str, wait: bool | None = None, progress: Progress | None = None) -> Iterator[None]:
    """Hold this host's measurement lock for the block; wait for it (saying who holds it once),
    or refuse when ``wait`` (default: not ``--no-wait``) is false. The wait's line goes to ``progress``
    (default: printed as it is)."""
    global _depth
    if _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    wait = _wait_default if wait is None else wait
    path = lock_path()
    fd = _open(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = holder(fd)
            if not wait:
                raise HostBusy(
                    f"another measurement runs on this host ({who}; lock {path}): two measurements on one "
                    "host measure each other; run again when it is done, or drop --no-wait to wait for it"
                )
            (progress or Progress.untimed())(
                f"waiting for the measurement running on this host to finish ({who}; lock {path}): "
                "two measurements on one host measure each other"
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:  # who holds it, for the next one's message; a full disk must not stop the measurement
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}, {_command}, study {study}\n".encode(), 0)
        except OSError:
            pass
        _depth = 1
        try:
            yield
        finally:
            _depth = 0
    finally:
        os.close(fd)  # closing drops the flock
