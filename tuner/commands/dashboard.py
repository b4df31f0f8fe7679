"""``tuner dashboard``: optuna-dashboard on the studies' storage (``output/dashboard``)."""

from __future__ import annotations

import argparse

from tuner.output.dashboard import serve
from tuner.studyfile.spec import default_storage_url


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve optuna-dashboard on the studies' storage: every study, its Pareto front, each trial's "
        "attrs, and a note per trial with its exact llama-server command line."
    )
    parser.add_argument(
        "--storage", default=None, help=f"Optuna storage URL (default: {default_storage_url()})"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1; the dashboard has no login)"
    )
    parser.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    parser.add_argument(
        "--no-notes", action="store_true", help="serve as is, without writing notes into the storage"
    )


def run(args: argparse.Namespace) -> int:
    serve(args.storage, args.host, args.port, notes=not args.no_notes)
    return 0
