"""``python -m benchmarks bench-serve``: section 7 of ``python -m benchmarks bench`` alone
(``benchmarks/serve_overhead``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.serve_overhead import benchmark, markdown
from tuner.errors import UserError
from tuner.output.files import write_atomic


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "tuner serve's own overhead: direct and proxied rounds alternating against a fake, fast streaming "
        "upstream at 1 and 64 clients (serve_overhead.LOADS; p50 and p99 added ms and their ratios), and the content classifier's "
        "accuracy on every built-in suite's held-out prompts."
    )
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each side (default: 6)")
    parser.add_argument(
        "--requests",
        type=int,
        default=2,
        help="requests per client per round at 64 clients (x4 at 1; default: 2)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")


def run(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.requests < 1:
        raise UserError("--rounds and --requests must be >= 1")
    found = benchmark(args.rounds, args.requests)
    print(markdown(found))
    if args.json:
        write_atomic(args.json, json.dumps(found.to_dict(), indent=2) + "\n")
    return 0
