"""``tuner verify``: a deployed preset section launched against the study's baseline (``output/verify_run``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner.commands.flags import add_no_wait
from tuner.decisions import evidence
from tuner.machine.llama_build import ENV_BIN_DIR
from tuner.output.preset import PRESET_FILE
from tuner.output.verify_run import DEFAULT_ROUNDS, verify_deployed


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Launch a deployed models-preset section and the study's baseline configuration in paired rounds on the "
        "study's held-out prompts, on this host and llama.cpp build, and say whether the speedup the export "
        "claimed holds. Exit 0: holds (shown faster than the baseline, its 95% interval reaching the claim's); "
        "4: smaller than claimed (shown faster, but the whole interval below the claim's); 1: no longer "
        "shown faster (the interval does not lie above 1); 2: a user error."
    )
    parser.add_argument("study", help="study name in the storage, or a study file (studies/NAME.yaml)")
    parser.add_argument(
        "--storage", help="Optuna storage URL (default: the study file's, else the shared SQLite file)"
    )
    parser.add_argument("--preset", type=Path, help=f"the preset file (default: reports/{PRESET_FILE})")
    parser.add_argument("--section", help="the section to verify (default: the study's, as export names it)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help=f"paired rounds, one fresh launch of each per round (default {DEFAULT_ROUNDS}, at least "
        f"{evidence.MIN_ROUNDS})",
    )
    parser.add_argument(
        "--bin-dir",
        type=Path,
        help=f"the llama.cpp build to verify on (default: ${ENV_BIN_DIR}, else the study file's, else the pinned)",
    )
    add_no_wait(parser)


def run(args: argparse.Namespace) -> int:
    return verify_deployed(args.study, args.storage, args.preset, args.section, args.rounds, args.bin_dir)
