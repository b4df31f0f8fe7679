"""``tuner workload import``: prompt suites from a server's request log (``workload_import``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner.measurement.workload import SPLIT_MIN_PROMPTS
from tuner.workload_import import import_traffic


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Prompt suites from what a server saw: `tuner workload import FILE --out suites/NAME.yaml`."
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    imp = actions.add_parser(
        "import",
        help="turn a request log into prompt-suite files a study measures",
        description=(
            "Turn what a server saw into prompt suites a study measures (workload.suites: [suites/NAME.yaml]). "
            "FILE holds one JSON object per line (or a JSON array of them): OpenAI chat requests "
            '({"messages": [...]}, or batch lines {"custom_id", "url": "/v1/chat/completions", "body"}), '
            'ShareGPT conversations ({"conversations": [{"from", "value"}]}) or SPEED-Bench rows '
            '({"question_id", "category", "turns"}). Each conversation becomes one prompt: its messages up to '
            "the first user message, then its later user messages as turns; the logged replies are dropped, "
            "since the tuner generates each reply on the configuration it measures. Content types come from a "
            "row's category, else from tuner's content classifier on the first user message. Prompt texts are "
            "never printed; nothing is written unless the whole file reads."
        ),
    )
    imp.add_argument("file", type=Path, help="the traffic file (JSON lines or a JSON array)")
    imp.add_argument(
        "--out",
        type=Path,
        required=True,
        help="the suite file to write, e.g. suites/traffic.yaml (with --by-type: suites/traffic-TYPE.yaml each)",
    )
    imp.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help=f"keep N conversations in all, spread over content types in proportion, at least "
        f"{SPLIT_MIN_PROMPTS} per type where it has that many (default: keep all)",
    )
    imp.add_argument(
        "--by-type",
        action="store_true",
        help="one suite file per content type, so `tuner export` can pick a winner per type",
    )
    imp.add_argument(
        "--seed", type=int, default=0, help="the sample's seed (default: 0); same seed, same files"
    )


def run(args: argparse.Namespace) -> int:
    for line in import_traffic(args.file, args.out, args.sample, args.by_type, args.seed):
        print(line)
    return 0
