"""``tuner bundle``: one archive that installs the tuner on a server without network (``bundle``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner.bundle import build_bundle, make_target, this_python
from tuner.paths import REPO_ROOT, writable_folder


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write one archive that installs the tuner on a server without network: the project, the wheels "
        "of its runtime dependencies for one Python version and platform, the pinned llama.cpp source "
        "archive (sha256 in bundle.json) and install.sh. Needs access to the package index here."
    )
    parser.add_argument(
        "--python-version", help=f"the server's Python, X.Y (default: this one's, {this_python()})"
    )
    parser.add_argument(
        "--platform",
        help="the server's wheel platform tag, e.g. manylinux2014_x86_64 (default: this machine's)",
    )
    parser.add_argument(
        "--extra",
        action="append",
        metavar="NAME",
        help="also the wheels of this optional extra of the project, e.g. postgres (repeatable)",
    )
    parser.add_argument(
        "--out", default=str(REPO_ROOT / "dist"), help="folder of the archive (default: dist/)"
    )


def run(args: argparse.Namespace) -> int:
    target = make_target(args.python_version, args.platform, args.extra)
    build_bundle(REPO_ROOT, writable_folder(Path(args.out), "--out"), target)
    return 0
