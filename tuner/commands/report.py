"""``tuner report``: a study's HTML report and CSV under reports/STUDY/ (``output/report``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner.errors import UserError
from tuner.output.analysis import report_data
from tuner.output.report import write_report
from tuner.paths import inside, reports_dir, writable_folder
from tuner.storage.store import open_stored_study
from tuner.studyfile.spec import default_storage_url


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write a self-contained HTML report (Pareto fronts, K/temperature/experts/threads/NUMA "
        "effects, speedup, roofline share, importances, Pareto table with commands) and a CSV "
        "of all trials under reports/STUDY/."
    )
    parser.add_argument("study", help="study name in the storage, or a study file (studies/NAME.yaml)")
    parser.add_argument(
        "--storage", help=f"Optuna storage URL (default: the study file's, else {default_storage_url()})"
    )
    parser.add_argument("--out", type=Path, help="output folder (default: reports/STUDY)")


def run(args: argparse.Namespace) -> int:
    if args.out is not None:
        writable_folder(args.out, "--out")
    study, record = open_stored_study(args.study, args.storage)
    if not any(t.state.is_finished() for t in study.get_trials(deepcopy=False)):
        raise UserError(f"study {study.study_name!r} has no finished trial; run it first (`tuner run`)")
    data = report_data(study, record)
    html_path, csv_path = write_report(data, args.out or inside(reports_dir(), study.study_name, "study"))
    if data.bandwidth and data.bandwidth.source != "fingerprint":
        print(f"note: {data.bandwidth.note} ({data.bandwidth.bytes_per_s / 1e9:.1f} GB/s)")
    print(f"report: {html_path}")
    print(f"trials: {csv_path}")
    return 0
