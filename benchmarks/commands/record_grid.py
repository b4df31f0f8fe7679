"""``python -m benchmarks record-grid``: a small space measured whole into a table (``benchmarks/grid``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.grid import record_grid
from tuner.commands.flags import add_no_wait
from tuner.errors import UserError
from tuner.progress import Progress


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Measure every configuration of a study's search space (all combinations of its choices; ranges "
        "need explicit choices) on this host, llama-bench style: one server per launch setting, temperatures "
        "as requests to it, rows flushed to JSONL as measured (rerun to resume), then a CSV table for "
        "`python -m benchmarks bench-search`."
    )
    parser.add_argument("study", help="study file, e.g. studies/bench-grid.yaml")
    parser.add_argument(
        "--out", type=Path, help="CSV table (default: reports/bench/grid-NAME.csv; rows in .jsonl beside it)"
    )
    parser.add_argument(
        "--leader-rounds",
        type=int,
        default=0,
        metavar="N",
        help="then launch the rows within 10%% of the best (at most 4) and the baseline again, N interleaved rounds, "
        "and rank them by their median rate over the baseline's (NAME.leaders.json; default 0: "
        "one launch per configuration only)",
    )
    add_no_wait(parser)


def run(args: argparse.Namespace) -> int:
    try:
        if args.leader_rounds < 0:
            raise UserError("python -m benchmarks record-grid: --leader-rounds must be 0 or more")
        csv = record_grid(args.study, args.out, progress=Progress.untimed(), leader_rounds=args.leader_rounds)
    except KeyboardInterrupt:
        print(
            "python -m benchmarks record-grid: interrupted; measured rows are kept, run it again to resume",
            flush=True,
        )
        return 130
    print(f"wrote {csv}")
    return 0
