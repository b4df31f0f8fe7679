"""Quantized drafts: requantized copies of a model, made once, offered as draft choices.

Why: a lower-bit copy of the target (self-speculation) or of a draft has the same
vocabulary, so it is always a compatible draft, and it decodes faster. A study asks for
``drafts: [{path: X.gguf, quantize: [Q8_0, Q4_0]}]``; each variant is made with the
pinned ``llama-quantize`` (``--allow-requantize`` when the source is already quantized)
into a cache keyed by the source's SHA-256 and the type, so it is made once per machine
and reused by every study and test. The source digest is itself cached by (path, size,
mtime), so a second run hashes nothing. A variant that cannot be made is a one-line
``UserError`` before any trial runs; its provenance (source digest, type, command) is
stored with the study (``StudyRecord.quantized_drafts``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tuner.errors import UserError
from tuner.machine.llama_build import binary
from tuner.paths import cache_dir

# "  10  or  Q2_K    :  2.96G, ..." in llama-quantize --help
ALLOWED_TYPE = re.compile(r"^\s*\d+\s+or\s+(\S+)\s*:", re.MULTILINE)
UNQUANTIZED = ("F32", "F16", "BF16", "ALL_F32", "MOSTLY_F16", "MOSTLY_BF16")


@dataclass(frozen=True)
class QuantizeRequest:
    """One variant a study asks for: ``source`` requantized to ``type``."""

    source: Path
    type: str

    @property
    def name(self) -> str:
        """The draft name offered to the search, e.g. ``gemma-3-270m-q4_k_m-Q8_0``."""
        return f"{self.source.stem}-{self.type}"


@dataclass(frozen=True)
class Variant:
    request: QuantizeRequest
    path: Path
    made: bool  # False: taken from the cache
    provenance: dict  # source, source_sha256, type, command


def default_cache() -> Path:
    return cache_dir() / "quantized"


@lru_cache(maxsize=8)
def allowed_types(quantize_binary: str) -> tuple[str, ...]:
    """The types this llama-quantize accepts, read from its --help (the list changes between versions)."""
    out = subprocess.run([quantize_binary, "--help"], capture_output=True, text=True, timeout=60)
    return tuple(ALLOWED_TYPE.findall(out.stdout + out.stderr))


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as source:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def source_digest(path: Path, cache: Path) -> str:
    """SHA-256 of ``path``, hashed once per (path, size, mtime): a second run reads it from a small file."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    index_file = cache / "digests.json"
    try:
        index = json.loads(index_file.read_text())
    except (OSError, ValueError):
        index = {}
    if key not in index:
        index[key] = file_sha256(path)
        cache.mkdir(parents=True, exist_ok=True)
        tmp = index_file.with_name(f"digests.json.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(index, indent=1, sort_keys=True))
        os.replace(tmp, index_file)
    return index[key]


def quantize_command(quantize_binary: Path, source: Path, out: Path, qtype: str, requantize: bool) -> list[str]:
    return [str(quantize_binary), *(["--allow-requantize"] if requantize else []), str(source), str(out), qtype]


def ensure_variant(request: QuantizeRequest, bin_dir: str | Path | None = None, cache: Path | None = None,
                   source_file_type: str | None = None, timeout_s: float = 1800.0) -> Variant:
    """The variant's file, made now if it is not in the cache (written to a temp name, then renamed)."""
    cache = cache or default_cache()
    tool = binary("llama-quantize", bin_dir)
    known = allowed_types(str(tool))
    if known and request.type not in known:
        raise UserError(f"quantize type {request.type!r} (for {request.source.name}) is not one llama-quantize "
                        f"accepts; use one of {', '.join(known)}")
    digest = source_digest(request.source, cache)
    out = cache / f"{digest[:16]}-{request.type}.gguf"
    requantize = (source_file_type or "").upper() not in UNQUANTIZED
    command = quantize_command(tool, request.source.resolve(), out, request.type, requantize)
    provenance = {"source": str(request.source.resolve()), "source_sha256": digest, "type": request.type,
                  "command": command}
    if out.is_file():
        return Variant(request, out, False, provenance)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.stem}.{os.getpid()}.tmp.gguf")
    try:
        done = subprocess.run(quantize_command(tool, request.source.resolve(), tmp, request.type, requantize),
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise UserError(f"llama-quantize {request.source.name} to {request.type}: not done after {timeout_s:g} s") from None
    if done.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        lines = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        # "llama_model_quantize: failed to quantize: <reason>" names the cause; the last line only the file
        why = next((ln.split("failed to quantize:", 1)[1].strip() for ln in lines if "failed to quantize:" in ln),
                   next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else f"exit {done.returncode}"))
        raise UserError(f"cannot quantize {request.source.name} to {request.type}: {why}")
    os.replace(tmp, out)
    return Variant(request, out, True, provenance)
