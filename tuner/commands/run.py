"""``tuner run STUDY``: run or resume a study on this host (``run/study_loop``), or only check it
(``--check``: the resolved space, the workload and a time estimate; ``--json`` for scripts)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from tuner.commands.flags import add_no_wait
from tuner.decisions.drift import Sentinels
from tuner.errors import UserError
from tuner.output.check_text import check_lines
from tuner.prepare import prepare
from tuner.run.study_loop import run_study
from tuner.run.trial_measurement import describe_trial
from tuner.storage import store
from tuner.studyfile.spec import StudySpec, load_spec


def _check_json(spec: StudySpec) -> dict:
    """``--check --json``: the resolved space and workload, for scripts."""
    ctx = prepare(spec)
    return {
        "study": spec.name,
        "space": ctx.space.as_dict(),
        "notes": list(ctx.space.notes),
        "drafts": list(ctx.drafts),
        "prompts": len(ctx.workload.prompts),
        **({"concurrency": list(spec.load_levels)} if spec.load_levels else {}),
        **({"constraints": {c.name: c.limit for c in spec.constraints}} if spec.constraints else {}),
    }


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run or resume an Optuna study of llama.cpp launch configurations. Each trial launches "
        "a pinned llama-server, measures decode tokens/s, draft acceptance and output quality, "
        "and stores them with the exact argv in the study's storage. Running the same study "
        "again resumes it."
    )
    parser.add_argument("study", help="study file, e.g. studies/demo.yaml")
    parser.add_argument("--trials", type=int, help="total trial budget (default: the study's budget.trials)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="validate the study file and models; print the resolved space, the workload and a time estimate; "
        "run nothing",
    )
    parser.add_argument(
        "--json", action="store_true", help="with --check: the resolved space as JSON, for scripts"
    )
    parser.add_argument(
        "--no-race",
        action="store_true",
        help="skip the finalist race at the end (the winner is then the best single recorded trial)",
    )
    add_no_wait(parser)


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.study)
    if args.trials is not None and args.trials < 1:
        raise UserError(f"--trials: must be >= 1, got {args.trials}")
    if args.json and not args.check:
        raise UserError("--json: only with --check (the check's output as JSON)")
    if args.check and not args.json:
        for line in check_lines(prepare(spec), race=not args.no_race):
            print(line)
        return 0
    if args.check:
        print(json.dumps(_check_json(spec), indent=2, default=str))
        return 0
    try:
        study = run_study(spec, args.trials, race=not args.no_race)
    except KeyboardInterrupt:
        print(
            f"tuner run: interrupted; measured trials are stored, run `tuner run {args.study}` again to resume",
            file=sys.stderr,
        )
        return 130
    best = store.best_feasible(study)
    if best is None:
        print("no feasible trial: every trial failed or fell below the quality floor")
        return 1
    # its speedup as the sentinels put it around its time: a first baseline reading they contradicted is left out
    corrected = Sentinels(store.read_trials(study), spec.measurement.noise_cv).speedup(best)
    if corrected is not None and best.metrics is not None:
        best = replace(best, metrics=replace(best.metrics, speedup=corrected))
    print(f"best feasible (recorded, one measurement): trial {best.number}: {describe_trial(best)}")
    return 0
