"""``tuner preset history|rollback``: a models-preset file's kept section versions (``output/preset``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner.output.preset import PRESET_FILE, history_lines, rollback, rollback_line


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "The earlier versions of a models-preset file's sections, kept beside it (FILE.history.jsonl) by "
        "every export that changes one: list them, or put one back in place."
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "history",
        help="list the kept versions: number, time, section, what replaced it, what it held",
        description="List a preset file's kept section versions, oldest first.",
    )
    listing.add_argument("file", type=Path, help=f"the preset file (by default reports/{PRESET_FILE})")
    listing.add_argument("section", nargs="?", help="only this section's versions")
    back = actions.add_parser(
        "rollback",
        help="put a section's kept version back in place; what it replaces is kept, so it can be undone",
        description="Put a section's kept version back in place; every other line of the file stays as it is.",
    )
    back.add_argument("file", type=Path, help=f"the preset file (by default reports/{PRESET_FILE})")
    back.add_argument("section", help="the section (router model name) to put back")
    back.add_argument(
        "--to",
        type=int,
        metavar="N",
        help="the version, as `tuner preset history` numbers it (default: the latest)",
    )


def run(args: argparse.Namespace) -> int:
    if args.action == "history":
        print("\n".join(history_lines(args.file, args.section)))
    else:
        print(rollback_line(args.file, *rollback(args.file, args.section, args.to)))
    return 0
