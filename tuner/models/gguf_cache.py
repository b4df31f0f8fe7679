"""GGUF headers cached per file, in this process and on disk, keyed by path, size and mtime.

A study reads its target and every draft, and `tuner inspect` the same files again;
a cached header costs milliseconds. The key holds the size and the mtime in ns, so a
changed file misses. A file modified in the last few seconds is not cached at all: a
rewrite within one timestamp tick could keep both (git's "racily clean" case). Entries
are written whole or not at all, and one that cannot be read or does not match its key
is a miss, never an error: the cache only saves time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

from tuner.models.gguf_header import Header, Vocab, parse_header
from tuner.paths import cache_dir

FORMAT = 2  # bump when Header changes: older entries then miss
RECENT_NS = 3 * 10**9  # younger files are read afresh every time
MAX_ENTRIES = 64  # on disk; the least recently used go first


def cache_root() -> Path:
    return cache_dir() / "gguf-info"


def read_header(path: Path) -> Header:
    """``path``'s header from the cache when the file is unchanged, else parsed (and cached)."""
    try:
        stat = path.stat()
    except OSError:
        return parse_header(path)  # which names the problem
    if path.is_dir() or time.time_ns() - stat.st_mtime_ns < RECENT_NS:
        return parse_header(path)
    return _memo(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=16)
def _memo(resolved: str, size: int, mtime_ns: int) -> Header:
    key = {"format": FORMAT, "path": resolved, "size": size, "mtime_ns": mtime_ns}
    entry = cache_root() / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32] + ".npz")
    header = _load(entry, key)
    if header is None:
        header = parse_header(Path(resolved))
        stat = os.stat(resolved)
        if (stat.st_size, stat.st_mtime_ns) == (size, mtime_ns):  # not changed while being read
            _store(entry, key, header)
    return header


clear_memo = _memo.cache_clear


def _load(entry: Path, key: dict) -> Header | None:
    try:
        with np.load(entry, allow_pickle=False) as npz:
            doc = json.loads(str(npz["header"]))
            if doc.pop("key") != key:
                return None
            vocab = None
            if doc.pop("has_vocab"):
                vocab = Vocab(npz["vocab_data"].astype(np.uint8), npz["vocab_ends"].astype(np.int64))
                if len(vocab) and vocab.ends[-1] != len(vocab.data):
                    return None
        header = Header(**{**doc, "array_keys": tuple(doc["array_keys"]), "spec_tensors": tuple(doc["spec_tensors"]),
                           "vocab": vocab})
    except Exception:  # missing, truncated, foreign or from another version: read the GGUF instead
        return None
    with contextlib.suppress(OSError):
        os.utime(entry)  # recently used: pruned last
    return header


def _store(entry: Path, key: dict, header: Header) -> None:
    """Write the entry under a temporary name, then rename: readers see all of it or nothing."""
    doc = {name: getattr(header, name) for name in Header.__dataclass_fields__ if name != "vocab"}
    arrays = {"header": np.array(json.dumps({**doc, "key": key, "has_vocab": header.vocab is not None}))}
    if header.vocab is not None:
        arrays.update(vocab_data=header.vocab.data, vocab_ends=header.vocab.ends)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, suffix=".tmp")
    except OSError:  # a read-only cache folder only costs the next read its time
        return
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]  # mypy matches **arrays against allow_pickle: bool; the keys are array names
        os.replace(tmp, entry)
        entries = sorted(entry.parent.glob("*.npz"), key=lambda p: p.stat().st_mtime_ns)
        for old in entries[:-MAX_ENTRIES]:
            old.unlink()
    except OSError:  # a full disk, or another process pruning the same entries
        Path(tmp).unlink(missing_ok=True)
