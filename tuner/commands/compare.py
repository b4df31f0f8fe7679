"""``tuner compare``: two studies joined on identical configurations (``output/compare``)."""

from __future__ import annotations

import argparse

from tuner.output.compare import compare_studies, format_markdown
from tuner.storage import store


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Compare two studies (e.g. two llama.cpp builds or two machines) the way compare-llama-bench "
        "does: trials joined on identical configurations, t/s A, t/s B and B/A, with a header "
        "naming the fingerprint keys that differ."
    )
    parser.add_argument("study_a", help="baseline study: name in the storage or a study file")
    parser.add_argument("study_b", help="study compared against it")
    parser.add_argument(
        "--storage", help="storage URL of A (default: the study file's, else the shared SQLite file)"
    )
    parser.add_argument(
        "--storage-b",
        help="storage URL of B (default: --storage, else B's study file's, else the shared SQLite file)",
    )
    parser.add_argument(
        "--format", choices=("md", "csv"), default="md", help="markdown table (default) or CSV rows"
    )


def run(args: argparse.Namespace) -> int:
    a, record_a = store.open_stored_study(args.study_a, args.storage)
    b, record_b = store.open_stored_study(args.study_b, args.storage_b or args.storage)
    comparison = compare_studies(a, record_a, b, record_b)
    text = comparison.rows.to_csv(index=False) if args.format == "csv" else format_markdown(comparison)
    print(text.rstrip("\n"))
    return 0
