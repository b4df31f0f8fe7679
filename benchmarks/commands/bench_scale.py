"""``python -m benchmarks bench-scale``: section 5 of ``python -m benchmarks bench`` from sweeps already recorded (``benchmarks/scale_regime``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.scale_regime import STUDY, markdown, recorded_regime, stored_race
from tuner.errors import UserError
from tuner.output.files import write_atomic
from tuner.paths import reports_dir


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Read the scale target's recorded K sweeps (grid-scale-grid-code, -prose and -summarize, as `python -m benchmarks bench` "
        "section 5 records them) without measuring: each family's best K against the K the structured search's "
        f"model predicts, the search replayed on each sweep, and the `{STUDY}` study's race (when it has been run "
        "in the storage) against each sweep's best and against the best of the sweeps pooled as the traffic it "
        "ranked on (code, prose and summaries, an equal share each)."
    )
    parser.add_argument(
        "folder",
        nargs="?",
        type=Path,
        default=reports_dir() / "bench" / "scale",
        help="where the sweeps were recorded (default: reports/bench/scale)",
    )
    parser.add_argument("--seeds", type=int, default=10, help="seeds of the search's replay (default: 10)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--storage",
        help=f"where the `{STUDY}` study was run (default: the default storage, storage/studies.db)",
    )


def run(args: argparse.Namespace) -> int:
    if args.seeds < 1:
        raise UserError("--seeds must be >= 1")
    found = recorded_regime(args.folder, seeds=args.seeds, race=stored_race(args.storage))
    print(markdown(found), end="")
    if args.json:
        write_atomic(args.json, json.dumps(found, indent=2, default=str) + "\n")
    return 0
