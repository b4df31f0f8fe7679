"""``tuner worker STUDY --storage postgresql://...``: ``tuner run`` joining a study kept in a shared database.

Any number of hosts may run one each (one per host: two measured runs on one host
measure each other); how they share the budget and the baseline is
``tuner.storage.coordination``'s.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from tuner.commands.flags import add_no_wait
from tuner.errors import UserError
from tuner.run.study_loop import run_study
from tuner.storage.coordination import safe_url, tally, worker_id
from tuner.studyfile.spec import load_spec


def refuse_sqlite(url: str) -> None:
    if url.startswith("sqlite"):
        raise UserError(
            f"storage {safe_url(url)}: workers need a database server: SQLite is not safely shared across hosts, "
            "and two workers on one host measure each other; use PostgreSQL "
            "(--storage postgresql://USER:PASSWORD@HOST:5432/DB), or `tuner run` alone on one host"
        )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Join a study kept in a PostgreSQL database and run its trials on this host until the "
        "study's budget is reached across all workers. The first worker creates the study and runs "
        "the baseline; the others wait for it. A host whose hardware or llama.cpp build differs "
        "from the study's is refused. Run one worker per host: two measured runs on one host "
        "measure each other."
    )
    parser.add_argument("study", help="study file, the same on every host, e.g. studies/demo.yaml")
    parser.add_argument(
        "--storage",
        help="the shared database, e.g. postgresql://tuner:PASSWORD@db-host:5432/tuner "
        "(default: the study file's storage)",
    )
    add_no_wait(parser)


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.study)
    if args.storage:
        spec = replace(spec, storage=args.storage)
    refuse_sqlite(spec.storage)
    try:
        study = run_study(spec)
    except KeyboardInterrupt:
        print(
            "tuner worker: interrupted; this worker's trial is recorded as failed (interrupted), "
            "the other workers go on",
            file=sys.stderr,
        )
        return 130
    print(
        f"worker {worker_id()} done: study {spec.name} has {tally(study).counted} of {spec.budget_trials} trials"
    )
    return 0
