"""Running a study: spec -> Optuna study -> one pinned llama.cpp run per trial -> storage.

Lifecycle of ``run_study``:
1. ``prepare`` reads the models' GGUF headers, refuses incompatible drafts, resolves
   the search space for this machine, loads the workload and takes the fingerprint;
   nothing is written before all of it succeeded.
2. ``open_study`` creates or resumes the Optuna study. A new study records the
   ``StudyRecord`` (fingerprint, build, models, space, workload, measurement and scorer);
   a resumed one is refused, with one line naming what changed, if its numbers would no
   longer be comparable.
3. The baseline trial (target alone, default experts, greedy, default threads) runs
   first, once across all workers; its outputs become the quality reference and its
   tokens/s the speedup base. Warm-start configurations are enqueued after it.
4. The sampler proposes the rest until the budget (trials and/or minutes) is spent;
   the budget counts finished trials (not interrupted ones, a retried one once), so a
   resumed study just continues.

One measured trial at a time: two llama.cpp runs on one box measure each other. More
hosts share one study through PostgreSQL (``tuner worker``, see ``tuner.storage.coordination``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable

import optuna

from tuner.context import StudyContext, check_lines, prepare, study_estimate
from tuner.decisions.drift import sentinel_due
from tuner.decisions.race import race_study, verdict_lines
from tuner.errors import UserError
from tuner.eta import Progress, RunClock, as_progress
from tuner.machine import hostlock
from tuner.measurement.failures import FailureReason, TrialFailure
from tuner.run_loop import ensure_baseline, open_study, run_until_budget
from tuner.search.prior import describe_prior
from tuner.search.space import baseline_config, suggest
from tuner.storage import outage, store
from tuner.storage.coordination import (
    fail_orphans,
    failed_elsewhere,
    hold_sqlite_study,
    safe_url,
    tally,
    worker_id,
)
from tuner.storage.journal import Journal
from tuner.storage.records import TrialRecord
from tuner.studyfile.spec import StudySpec, load_spec
from tuner.trial import Interrupted, TrialHooks, TrialMeasurement, describe_trial


class FailedElsewhere(Exception):
    """This process's trial was failed as dead by another worker: nothing of it is stored (see
    ``coordination.failed_elsewhere``); the run goes on with the next trial."""


class TrialRunner:
    """The Optuna objective: one trial = one configuration suggested, measured (``tuner.trial``), stored."""

    def __init__(
        self,
        ctx: StudyContext,
        study: optuna.Study,
        progress: Callable[[str], None] = print,
        journal: Journal | None = None,
    ):
        self.ctx = ctx
        self.study = study
        self.progress = progress
        self.journal = journal
        self.trials = TrialMeasurement(ctx, study)
        self.failed_elsewhere: str | None = None  # why the last trial's measurement was dropped

    def __call__(self, trial: optuna.Trial) -> tuple[float, ...]:
        config = suggest(trial, self.ctx.space)
        self.trials.new_reference = None
        hooks = TrialHooks(
            on_running=lambda port: store.mark_running(trial, worker_id(), port),
            on_pass=self._reporter(trial),
        )
        stage, reason = store.search_note(trial)
        search = {"stage": stage, "reason": reason} if stage else {}
        try:
            record = self.trials.measure(config, store.role_of(trial), trial.number, hooks, search)
        except Interrupted as stop:
            self._store(trial, stop.record, None)
            raise
        lost = failed_elsewhere(self.study, trial, self.ctx.spec.workers)
        if lost is not None:
            self.failed_elsewhere = lost
            raise FailedElsewhere(lost)
        values = (
            tuple(record.objective(o.metric) for o in self.ctx.spec.objectives) if record.complete else None
        )
        self._store(trial, record, values)
        if record.state == "PRUNED":
            raise optuna.TrialPruned(record.pruned)
        if record.failure is not None:
            raise TrialFailure(FailureReason(record.failure.reason), record.failure.detail, record.log_tail)
        return values

    def _reporter(self, trial: optuna.Trial) -> Callable[[int, float], None]:
        """Running tokens/s to Optuna after each pass, where Optuna has intermediate values: a study whose
        one objective is tokens/s. A multi-objective study has none (``Trial.report`` refuses it, and TPE
        fails on pruned trials that carry them); its running rates are in the record's samples."""
        if [o.metric for o in self.ctx.spec.objectives] != ["tokens_per_second"]:
            return lambda step, rate: None
        return lambda step, rate: store.report_running_rate(trial, step, rate)

    def _store(self, trial: optuna.Trial, record: TrialRecord, values: tuple[float, ...] | None) -> None:
        """The journal first (a storage outage loses no measurement, see ``tuner.storage.journal``),
        then the trial's storage writes: a baseline's reference, the constraint, the record."""
        reference, self.trials.new_reference = self.trials.new_reference, None
        if self.journal is not None:
            self.journal.keep(trial, record, values, reference)
        if reference is not None:
            store.write_reference(self.study, reference)
        if record.complete:
            # Feasible when <= 0: samplers read them from here, and nothing below the floor is reported as best.
            for name, value in (record.constraints or {"quality_floor": record.constraint}).items():
                trial.set_constraint(name, value)
        store.write_trial_record(trial, record)

    def run_sentinel(self) -> TrialRecord:
        """The baseline configuration re-measured now, stored as a trial of role sentinel."""
        base = store.baseline_trial(self.study)
        record = self.trials.measure(baseline_config(self.ctx.space), "sentinel", None)
        values = None if record.failure else [record.objective(o.metric) for o in self.ctx.spec.objectives]
        return store.add_measured_trial(self.study, record, base.params, base.distributions, values)


def run_study(
    spec: StudySpec, trials: int | None = None, progress: Callable[[str], None] = print, race: bool = False
) -> optuna.Study:
    """Run or resume a study until its budget is spent, alone or as one of its workers; returns the study.

    Every ``sentinel.every_trials`` trials (or minutes) this process re-measures the baseline
    configuration first (tuner.decisions.drift). With ``race`` the finalists are raced at the end (tuner.decisions.race).
    Measures under the host's measurement lock (``tuner.machine.hostlock``); a storage outage stops
    it in one line with the measured trials kept in the journal (``tuner.storage.journal``), which
    the next run stores first."""
    progress = as_progress(progress)
    ctx = prepare(spec, progress)
    journal = Journal(spec.name, spec.storage)
    with hostlock.measuring(spec.name, progress=progress), outage.guard(spec.storage, journal.pending):
        study = _run_locked(ctx, journal, trials, progress, race)
        journal.settle()
    return study


def _starting_notes(ctx: StudyContext, study: optuna.Study, progress: Progress) -> None:
    """What the space left out on this machine, and the warm start from an earlier study."""
    for note in ctx.space.notes:
        progress(f"note: {note}")
    prior = store.read_prior(study)
    if prior:
        uses = (
            [f"its {', '.join(f'{k}={v}' for k, v in prior['hardware'].items())} first in the hardware stage"]
            if prior["hardware"]
            else []
        ) + (["its winner right after the baseline"] if prior["params"] else [])
        progress(
            f"warm start from {describe_prior(prior)}: {' and '.join(uses)} (sampler.reuse: false turns it off)"
        )


class TrialLoop:
    """One process's trials: the baseline re-measured when a sentinel is due, then one Optuna trial at a
    time, a progress line after each."""

    def __init__(
        self,
        ctx: StudyContext,
        study: optuna.Study,
        journal: Journal,
        progress: Progress,
        budget: int,
        clock: RunClock,
        deadline: float | None,
    ):
        self.ctx, self.study, self.journal, self.progress = ctx, study, journal, progress
        self.budget, self.clock, self.deadline = budget, clock, deadline
        self.objective = TrialRunner(ctx, study, progress, journal)

    def report(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """Optuna's callback after each trial: the progress line with the best so far."""
        self.journal.stored(trial.number)
        best = store.best_feasible(study)
        best_text = (
            f"best feasible {best.metrics.tokens_per_second:.1f} t/s (trial {best.number})"
            if best
            else "no feasible trial yet"
        )
        record = store.read_trial(trial)
        why = f" [{record.search['stage']}: {record.search['reason']}]" if record.search else ""
        counted = tally(study).counted
        self.clock.replan(counted)
        self.progress(
            f"[{counted}/{self.budget}] trial {trial.number}{why}: {describe_trial(record)} | {best_text}"
        )

    def run_one(self) -> None:
        """A sentinel if one is due, then one trial (a trial another worker failed is said, not raised)."""
        study, objective = self.study, self.objective
        if sentinel_due(store.read_trials(study), worker_id(), self.ctx.spec.sentinel, time.time()):
            sentinel = describe_trial(objective.run_sentinel())
            self.clock.replan(tally(study).counted)
            self.progress(f"sentinel: {sentinel}")
        timeout = max(1.0, self.deadline - time.monotonic()) if self.deadline else None
        objective.failed_elsewhere = None
        try:
            study.optimize(
                objective, n_trials=1, timeout=timeout, catch=(TrialFailure,), callbacks=[self.report]
            )
        except (FailedElsewhere, ValueError):  # Optuna cannot tell a trial another worker failed: ValueError
            if objective.failed_elsewhere is None:
                raise
            self.progress(objective.failed_elsewhere)


def _open_for_run(ctx: StudyContext, journal: Journal, progress: Progress, lock) -> optuna.Study:
    """The study opened for this run: progress to the dashboard, the journal replayed, orphans failed."""
    study = open_study(ctx)
    progress.sink = lambda figures: store.write_progress(study, {"command": "tuner run", **figures})
    journal.replay(study, progress)  # trials measured before a storage outage, before orphans are failed
    if store.created_by(study) != worker_id():
        study.sampler.reseed_rng()  # a joining worker or a resumed run must not replay the creator's proposals
    if lock:
        fail_orphans(study, ctx.spec.workers, progress)
    return study


def _run_locked(
    ctx: StudyContext, journal: Journal, trials: int | None, progress: Progress, race: bool
) -> optuna.Study:
    spec = ctx.spec
    lock = hold_sqlite_study(spec.storage, spec.name)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # our progress line replaces Optuna's
    try:
        study = _open_for_run(ctx, journal, progress, lock)
        budget = trials or spec.budget_trials
        deadline = time.monotonic() + spec.budget_minutes * 60 if spec.budget_minutes else None
        clock = RunClock(progress, study_estimate(ctx), budget, race, deadline)
        clock.replan(tally(study).counted)
        _starting_notes(ctx, study, progress)
        loop = TrialLoop(ctx, study, journal, progress, budget, clock, deadline)
        done = tally(study).counted
        progress(f"study {spec.name}: {done} of {budget} trials done; storage {safe_url(spec.storage)}")
        if done < budget:
            ensure_baseline(study, ctx, loop.run_one, progress)
            run_until_budget(study, loop.run_one, budget, spec.workers, deadline, progress)
        if race:
            result = race_study(ctx, study, progress)
            for line in (
                verdict_lines(result) if result else ["race: no feasible trial besides the baseline to race"]
            ):
                progress.out(line)  # the result, not progress
        progress.plan(0.0)
        progress.record(f"finished: {tally(study).counted} of {budget} trials" + (", raced" if race else ""))
    finally:
        optuna.logging.set_verbosity(verbosity)
        if lock:
            try:
                lock.close()
            except (
                OSError
            ):  # its holder line could not be flushed (a full disk): the lock is released all the same
                pass
    return study


def _check_json(spec: StudySpec) -> dict:
    """``--check --json``: the resolved space and workload, for scripts."""
    ctx = prepare(spec)
    return {
        "study": spec.name,
        "space": ctx.space.describe(),
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
    hostlock.add_argument(parser)


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
    print(f"best feasible (recorded, one measurement): trial {best.number}: {describe_trial(best)}")
    return 0
