"""``python -m benchmarks``: the benchmarks of the tuner, one subcommand each, outside the installed package.

The same command-line machinery as ``tuner`` (``tuner.cli``): lazily imported subcommand modules, a user's
mistake as one line and a meaningful exit code.
"""

from __future__ import annotations

import sys

from tuner.cli import CommandLine
from tuner.cli import main as tuner_main

PROG = "python -m benchmarks"

# (name, module, one-line help). The order here is the order in `python -m benchmarks --help`.
SUBCOMMANDS: list[tuple[str, str, str]] = [
    (
        "record-grid",
        "benchmarks.commands.record_grid",
        "measure every configuration of a small space into a table for bench-search",
    ),
    (
        "bench-search",
        "benchmarks.commands.bench_search",
        "replay a recorded table: trials each sampler needs to find the best configuration",
    ),
    (
        "bench-scale",
        "benchmarks.commands.bench_scale",
        "section 5 from the scale target's recorded K sweeps: best against predicted K, measuring nothing",
    ),
    (
        "bench-operator",
        "benchmarks.commands.bench_operator",
        "replay operator-scale landscapes (96 cores, 3 drafts, MoE, lookup stacks): trials and seconds to 3%%",
    ),
    (
        "bench-serve",
        "benchmarks.commands.bench_serve",
        "section 7 alone: tuner serve's added latency at 1 and 64 streaming clients; the classifier held out",
    ),
    (
        "bench",
        "benchmarks.commands.bench",
        "benchmark the tuner: search efficiency, overhead vs llama-bench, repeatability",
    ),
]

BENCHMARKS = CommandLine(
    PROG,
    "Benchmarks of llama-tuner itself: search efficiency, decision rules' error rates, overhead against "
    "llama-bench, repeatability, the scale regime. Run from the repository root.",
    SUBCOMMANDS,
)


def main(argv: list[str] | None = None) -> int:
    return tuner_main(argv, BENCHMARKS)


if __name__ == "__main__":
    sys.exit(main())
