"""``python -m benchmarks bench``: every benchmark section in one session (``benchmarks/session``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.session import Asked, run_bench
from tuner.commands.flags import add_no_wait
from tuner.paths import REPO_ROOT


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Benchmark the tuner in one session: (1) trials each sampler needs to come within 3% of the best "
        "configuration of a recorded grid, (2) the tuner's tokens/s and wall time per trial against "
        "llama-bench's, alternating, (3) two seeds of a study, winners re-measured side by side, "
        "(5) the scale target's K sweep against the structured search. Writes reports/bench/bench.json and bench.md."
    )
    _studies(parser)
    parser.add_argument("--seeds", type=int, default=20, help="seeds per sampler in the replay (default: 20)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=7,
        help="alternating rounds for overhead and re-measuring; one round varies by about 10%% on a "
        "shared VM, the median of 7 by a few %% (default: 7)",
    )
    parser.add_argument(
        "--decision-runs",
        type=int,
        default=400,
        help="simulated races per cell of the decision section (default: 400; 10x at the default host)",
    )
    parser.add_argument(
        "--repeat-trials",
        type=int,
        help="trials per repeatability study (default: the study's own budget, 20 for the demo)",
    )
    parser.add_argument(
        "--gguf",
        type=Path,
        action="append",
        help="a GGUF for the metadata-read section, repeatable (default: Gemma 3 270M when its package "
        "is installed, and the --study's target)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="every section on its smallest input (one prompt of the first suite, 8 tokens, the grid's first launches, one "
        "seed and round, one operator landscape): shows each section runs, its figures mean nothing",
    )
    parser.add_argument(
        "--out", type=Path, help="output folder (default: reports/bench, with --quick reports/bench/quick)"
    )
    add_no_wait(parser)


def _studies(parser: argparse.ArgumentParser) -> None:
    """The studies the sections measure."""
    parser.add_argument(
        "--grid-study",
        type=Path,
        default=REPO_ROOT / "studies" / "bench-grid.yaml",
        help="study whose (all-choices) space is recorded as the grid (default: studies/bench-grid.yaml)",
    )
    parser.add_argument(
        "--study",
        type=Path,
        default=REPO_ROOT / "studies" / "demo.yaml",
        help="study for the overhead and repeatability runs (default: studies/demo.yaml)",
    )
    parser.add_argument(
        "--scale-grid-study",
        type=Path,
        default=REPO_ROOT / "studies" / "scale-grid.yaml",
        help="section 5's K sweep, recorded on code and on prose (default: studies/scale-grid.yaml)",
    )


def run(args: argparse.Namespace) -> int:
    asked = Asked(args.seeds, args.rounds, args.decision_runs, args.repeat_trials, args.quick)
    return run_bench(args.grid_study, args.study, args.gguf, args.out, asked, args.scale_grid_study)
