"""``python -m benchmarks bench-search``: samplers replayed on a recorded table (``benchmarks/replay``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.replay import DEFAULT_OBJECTIVES, STRATEGIES, TOLERANCE, benchmark, load_landscape, markdown
from benchmarks.table import read_table
from tuner.errors import UserError
from tuner.output.files import write_atomic


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Replay a recorded grid (CSV or JSONL: parameter columns and metric columns, e.g. from "
        "`python -m benchmarks record-grid`) as a tabular benchmark: each sampler's suggestions are looked up, tokens/s "
        "gets noise of the recorded cv, and the trials each needs to come within the tolerance of the best "
        "feasible tokens/s are compared over seeds."
    )
    parser.add_argument("table", type=Path, help="the recorded table (.csv or .jsonl)")
    parser.add_argument(
        "--params",
        help="comma-separated parameter columns, in the order they are asked "
        "(default: every non-result column that varies)",
    )
    parser.add_argument(
        "--objectives",
        help="comma-separated objective columns "
        f"(default: those of {', '.join(DEFAULT_OBJECTIVES)} in the table)",
    )
    parser.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help=f"comma-separated (default: {','.join(STRATEGIES)})",
    )
    parser.add_argument("--seeds", type=int, default=10, help="seeds per strategy (default: 10)")
    parser.add_argument(
        "--trials", type=int, help="trials per replay (default: the number of configurations)"
    )
    parser.add_argument(
        "--tolerance", type=float, default=TOLERANCE, help="regret counted as found (default: 0.03)"
    )
    parser.add_argument("--jobs", type=int, default=-1, help="parallel replays (default: all CPUs)")
    parser.add_argument("--json", type=Path, help="also write the full result here")


def _split(text: str | None) -> list[str] | None:
    return [s.strip() for s in text.split(",") if s.strip()] if text else None


def run(args: argparse.Namespace) -> int:
    if args.trials is not None and args.trials < 1:
        raise UserError(f"--trials: must be >= 1, got {args.trials}")
    landscape = load_landscape(read_table(args.table), _split(args.params), _split(args.objectives))
    result = benchmark(
        landscape,
        strategies=tuple(_split(args.strategies) or STRATEGIES),
        seeds=args.seeds,
        budget=args.trials,
        tolerance=args.tolerance,
        jobs=args.jobs,
    )
    result["table"] = str(args.table)
    print(markdown(result), end="")
    if args.json:
        write_atomic(args.json, json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
