"""Flags several commands share: ``--no-wait`` for every command that measures on this host."""

from __future__ import annotations

import argparse


def add_no_wait(parser: argparse.ArgumentParser) -> None:
    """``--no-wait``: ``tuner.cli`` hands it to ``machine/hostlock`` before the command runs."""
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="refuse at once when another measurement runs on this host, instead of waiting for it",
    )
