"""Output files written whole or not at all.

Why: a report or an export written onto a full disk left a traceback and an empty
``index.html`` in place of the previous one. Every output file goes through
``write_atomic``: the text goes to a temporary file in the same folder (so the rename
never crosses file systems), is flushed to disk, then renamed over the old file. A
failed write leaves the previous file (or none) and no temporary, and is one line naming
the path and the free space left there.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path

from tuner.errors import UserError


def write_atomic(path: Path, data: str | bytes, mode: int | None = None) -> Path:
    """Replace ``path`` with ``data`` in one rename; ``mode`` (e.g. 0o755 for a script), else the old
    file's mode, else the usual mode of a new file (0o666 less the umask)."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode if mode is not None else _mode_of(path))
        os.replace(tmp, path)
    except OSError as err:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise write_error(path, err) from None
    return path


def _mode_of(path: Path) -> int:
    """The existing file's permission bits, else what ``open()`` would give a new file."""
    with contextlib.suppress(OSError):
        return path.stat().st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_error(path: Path, err: OSError) -> UserError:
    """One line: the path, the system's reason, the free space where it was written, the fix."""
    reason = err.strerror or type(err).__name__
    full = err.errno in (errno.ENOSPC, errno.EDQUOT)
    fix = "free some space or write elsewhere" if full else "write to a folder you can write to"
    return UserError(f"{path}: cannot write ({reason}; {free_space(path)}); {fix}")


def free_space(path: Path) -> str:
    """``"12.3 MB free on /x"`` for the nearest existing folder of ``path``."""
    folder = next((p for p in Path(path).absolute().parents if p.is_dir()), Path("/"))
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return f"free space on {folder} unknown"
    return f"{human_bytes(free)} free on {folder}"


def human_bytes(size: float) -> str:
    if size < 1000:
        return f"{int(size)} B"
    for unit in ("kB", "MB", "GB"):
        size /= 1000
        if size < 1000:
            break
    return f"{size:.1f} {unit}"
