"""Where things live: the repository's folders and the per-user cache."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


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
