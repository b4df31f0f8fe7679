"""Where things live: the repository's folders and the per-user cache."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tuner.errors import UserError

REPO_ROOT = Path(__file__).resolve().parent.parent


MAX_NAME = 100
NAME_RULE = (
    "a study name is one folder name: letters, digits, '.', '_' and '-', not starting with '.' or '-', "
    f"at most {MAX_NAME} characters"
)
_NAME_CHAR = re.compile(r"[A-Za-z0-9_.-]")


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a study, or None: a study's name becomes a folder (its logs, its report),
    so it must never be a path out of that folder."""
    if not isinstance(name, str) or not name:
        return "is empty"
    if len(name) > MAX_NAME:
        return f"is {len(name)} characters long"
    if "/" in name or "\\" in name:
        return "holds a path separator"
    if name[0] in ".-":
        return f"starts with {name[0]!r}"
    bad = next((c for c in name if not _NAME_CHAR.fullmatch(c)), None)
    return None if bad is None else f"holds {bad!r}"


def check_study_name(name: object, where: str) -> str:
    """``name`` if it is a safe study name, else one line: ``where: 'NAME' problem; the rule``."""
    problem = name_problem(name)
    if problem:
        raise UserError(f"{where}: {name!r} {problem}; {NAME_RULE}")
    return name  # type: ignore[return-value]


def inside(base: Path, name: str, what: str) -> Path:
    """``base / name``, refused in one line unless it stays inside ``base``: a study's name (or any
    user's value) joined into a path is never a way out of its folder. The check is on the normalised
    path (``..`` and absolute names), so a symlink the operator made inside ``base`` stays theirs."""
    root = Path(os.path.normpath(Path(base).expanduser().absolute()))
    path = Path(os.path.normpath(root / name))
    if root not in path.parents:
        raise UserError(f"{what} {name!r}: the path {path} leaves {root}; {NAME_RULE}")
    return path


def cache_dir() -> Path:
    """The tuner's cache (pinned llama.cpp builds, source archives), outside the repo."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llama-tuner"


def models_dir() -> Path:
    """Where the built-in synthetic model family is generated (ignored by git)."""
    return Path(os.environ.get("TUNER_MODELS_DIR") or REPO_ROOT / "models")


def reports_dir() -> Path:
    return Path(os.environ.get("TUNER_REPORTS_DIR") or REPO_ROOT / "reports")


def storage_dir() -> Path:
    """Default home of the shared Optuna SQLite file (ignored by git)."""
    return Path(os.environ.get("TUNER_STORAGE_DIR") or REPO_ROOT / "storage")


def writable_folder(path: Path, option: str) -> Path:
    """``path`` as an output folder that can be created (or exists) and written, checked before any
    work; anything else is one line naming ``option`` and the path. Nothing is created here."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise UserError(
            f"{option} {path}: is a file, not a folder; pass a folder path (it is created if missing)"
        )
    _check_parents(path, path, option)
    return path


def writable_file(path: Path, option: str) -> Path:
    """``path`` as an output file: not a folder, in a folder that can be created (or exists) and written."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise UserError(f"{option} {path}: is a folder; pass a file path")
    _check_parents(path.parent, path, option)
    return path


def _check_parents(folder: Path, path: Path, option: str) -> None:
    """The nearest existing one of ``folder`` and its parents must be a folder this user can write to."""
    existing = next(p for p in (folder, *folder.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        raise UserError(
            f"{option} {path}: {existing} is a file, not a folder; pass a path whose parents are "
            "folders (missing ones are created)"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(
            f"{option} {path}: {existing} is not writable by this user; pass a folder you can write to"
        )
