"""The target's quantization on a memory-bound target: llama-bench decode of its Q4_0 variant against its F16
variant, the two interleaved round by round (the bar: at least 1.5x).

Why llama-bench and not a study: the bar is about decode speed alone, which llama-bench measures with the
least around it; the variants are the study's own (``models.quantize``: made once, cached by the source's
digest). Why interleaved: on a shared host a disturbance hits both files of a round alike, so the per-round
ratio is the figure and its spread is shown, not one pass of each.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

from tuner.machine.llama_build import binary
from tuner.models.gguf_info import read_model_info
from tuner.models.quantize import QuantizeRequest, ensure_variant

TYPES = ("F16", "Q4_0")
BAR = 1.5  # the Q4_0 variant decodes at least this much faster than the F16 one


def measure(source: Path, rounds: int = 5, tokens: int = 32, threads: int | None = None) -> dict[str, Any]:
    """Per round, llama-bench ``-n tokens`` on each variant of ``source``; the median per-round ratio."""
    source_type = read_model_info(source).file_type
    files = {t: ensure_variant(QuantizeRequest(source, t), source_file_type=source_type).path for t in TYPES}
    bench = binary("llama-bench")
    rates: dict[str, list[float]] = {t: [] for t in TYPES}
    for _ in range(rounds):
        for qtype, path in files.items():
            argv = [str(bench), "-m", str(path), "-p", "0", "-n", str(tokens), "-r", "2", "-o", "json"]
            argv += ["-t", str(threads)] if threads else []
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
            rates[qtype].append(float(json.loads(done.stdout)[0]["avg_ts"]))
    ratios = [q / f for q, f in zip(rates["Q4_0"], rates["F16"])]
    return {
        "source": source.name,
        "bytes": {t: files[t].stat().st_size for t in TYPES},
        "tokens_per_second": {t: statistics.median(r) for t, r in rates.items()},
        "ratios": ratios,
        "ratio": statistics.median(ratios),
        "met": statistics.median(ratios) >= BAR,
    }


def markdown(found: dict[str, Any]) -> str:
    gb = {t: found["bytes"][t] / 1e9 for t in TYPES}
    rate = found["tokens_per_second"]
    spread = f"{min(found['ratios']):.2f}-{max(found['ratios']):.2f}"
    return "\n".join(
        [
            f"llama-bench decode of {found['source']}'s variants, interleaved, {len(found['ratios'])} rounds "
            "(median tokens/s per file; the ratio is the median of the per-round ratios, its range beside it):",
            "",
            "| variant | file | tokens/s (median) |",
            "|---|---|---|",
            *(f"| {t} | {gb[t]:.2f} GB | {rate[t]:.1f} |" for t in TYPES),
            "",
            f"Q4_0 over F16: x{found['ratio']:.2f} (rounds {spread}); target at least x{BAR}: "
            f"{'met' if found['met'] else 'MISSED'}",
        ]
    )
