"""``tuner export``: race the finalists (``decisions/export_choice``) and export the winner (``output/export_study``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner.commands.flags import add_no_wait
from tuner.decisions.export_choice import ExportRequest
from tuner.decisions.trial_selection import POLICIES
from tuner.output.export_study import export_study
from tuner.output.preset import PRESET_FILE


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Export the chosen configuration of a study: serve.sh, config.json/.yaml and a section of the "
        "shared llama-server --models-preset file. Policies: "
        + "; ".join(f"{k}: {v}" for k, v in POLICIES.items())
        + ". The finalists are first raced against the baseline on this host, one fresh launch each per round."
    )
    parser.add_argument("study", help="study name in the storage, or a study file (studies/NAME.yaml)")
    parser.add_argument(
        "--storage", help="Optuna storage URL (default: the study file's, else the shared SQLite file)"
    )
    parser.add_argument(
        "--policy", choices=tuple(POLICIES), default="max-tps", help="selection policy (default: max-tps)"
    )
    parser.add_argument(
        "--min-acceptance", type=float, help="only trials whose draft acceptance is at least this"
    )
    parser.add_argument("--trial", type=int, help="export this feasible trial instead of applying a policy")
    parser.add_argument(
        "--no-race",
        action="store_true",
        help="export the recorded choice without racing it (its figures are single measurements)",
    )
    per_type = parser.add_mutually_exclusive_group()
    per_type.add_argument(
        "--per-type",
        action="store_true",
        default=None,
        help="also export one configuration per content type (STUDY-TYPE preset sections, "
        "serve-router.sh, ROUTER.md); the default when the study measured several types: "
        "each type's winner on its tuning prompts is raced on held-out prompts and gets a "
        "section only when it beats the pooled winner there beyond the noise",
    )
    per_type.add_argument(
        "--no-per-type", dest="per_type", action="store_false", help="export the pooled winner only"
    )
    parser.add_argument(
        "--concurrency",
        type=_levels,
        metavar="N,N,...",
        help="also export one configuration per load class: a STUDY-cN preset section with N slots, "
        "the best recorded aggregate tokens/s at N simultaneous users (default: every level "
        "the study measured, when it measured more than one user)",
    )
    parser.add_argument("--out", type=Path, help="output folder (default: reports/STUDY/export)")
    add_no_wait(parser)
    parser.add_argument("--preset", type=Path, help=f"shared preset file (default: reports/{PRESET_FILE})")


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give user counts separated by commas, such as 1,4"
        ) from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every level needs at least 1 user")
    return levels


def run(args: argparse.Namespace) -> int:
    request = ExportRequest(
        policy=args.policy,
        min_acceptance=args.min_acceptance,
        trial=args.trial,
        no_race=args.no_race,
        per_type=args.per_type,
        concurrency=args.concurrency,
    )
    export_study(args.study, args.storage, request, out=args.out, preset_file=args.preset)
    return 0
