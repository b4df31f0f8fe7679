"""``tuner doctor``: the machine fingerprint and advice before measuring (``output/doctor``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner.machine import topology
from tuner.output.doctor import print_doctor, record_topology


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the fingerprint, host state and advice as JSON"
    )
    parser.add_argument(
        "--bandwidth",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="probe memory bandwidth at several thread counts, up to one per physical core (a numpy copy "
        "of 256 MiB, a few seconds); default: on the live machine, not for --sysfs-root; "
        "TUNER_MEMORY_BANDWIDTH set: that figure, no probe",
    )
    parser.add_argument(
        "--sysfs-root",
        type=Path,
        default=topology.LIVE_ROOT,
        metavar="DIR",
        help="read sys/ and proc/ under DIR instead of / (e.g. a recorded tree)",
    )
    parser.add_argument(
        "--study",
        metavar="STUDY",
        help="also advise on transparent hugepages from what this study's trials measured (name or study file)",
    )
    parser.add_argument(
        "--storage", help="the study's storage URL (default: the study file's, or the default)"
    )
    parser.add_argument(
        "--record-sysfs",
        type=Path,
        metavar="DIR",
        help="copy the topology files this command reads into DIR (to send with a bug report)",
    )


def run(args: argparse.Namespace) -> int:
    root: Path = args.sysfs_root
    if args.record_sysfs is not None:
        record_topology(args.record_sysfs, root)
        return 0
    print_doctor(root, args.bandwidth, args.study, args.storage, args.json)
    return 0
