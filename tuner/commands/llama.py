"""``tuner llama``: build (or locate) the pinned llama.cpp and print its manifest (``machine/llama_build``)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from tuner.machine.llama_build import (
    ENV_BIN_DIR,
    PINNED_LLAMA_COMMIT,
    PINNED_VERSION,
    SDIST_NAME,
    build_pinned,
    find_build_info,
    keep_sdist,
    pinned_sdist,
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Build the pinned llama.cpp (llama-cpp-python "
        f"{PINNED_VERSION} sdist, commit {PINNED_LLAMA_COMMIT}) into the cache, or, with "
        f"--bin-dir / ${ENV_BIN_DIR}, check a build of your own. Prints the build manifest "
        "that every study records."
    )
    parser.add_argument(
        "--bin-dir",
        help=f"use this folder of llama.cpp binaries (default: ${ENV_BIN_DIR} or the pinned build)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild the pinned tools even if cached")
    parser.add_argument("--jobs", type=int, help="parallel build jobs (default: all CPUs)")
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")
    parser.add_argument(
        "--sdist",
        metavar="ARCHIVE",
        help=f"take the pinned source from this {SDIST_NAME} (an offline bundle's; sha256 checked) "
        "and keep it in the cache instead of downloading it",
    )
    parser.add_argument(
        "--fetch-only",
        action="store_true",
        help="put the pinned source archive in the cache (from --sdist, or downloaded) and stop: no build",
    )


def run(args: argparse.Namespace) -> int:
    if args.sdist or args.fetch_only:
        kept = keep_sdist(Path(args.sdist).expanduser()) if args.sdist else pinned_sdist()
        print(f"llama.cpp: the pinned source archive is in {kept} (sha256 checked): a build needs no network")
        if args.fetch_only:
            return 0
    if args.bin_dir or os.environ.get(ENV_BIN_DIR):
        info = find_build_info(args.bin_dir)
    else:
        info = build_pinned(force=args.force, jobs=args.jobs)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for key in ("source", "commit", "build_number", "version", "compiler", "target", "bin_dir"):
            print(f"{key:>13}: {info.get(key)}")
    return 0
