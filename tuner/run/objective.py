"""The Optuna objective of a study: one trial = one configuration suggested, measured
(``run/trial_measurement``) and stored, with the journal first; and this process's trials, one at a
time, each with its progress line.

The study's loop (``run/study_loop``) calls ``ProcessTrials.run_one`` until the budget counts; nothing
here calls back into it.
"""

from __future__ import annotations

import time
from typing import Callable

import optuna

from tuner.decisions.drift import Sentinels, sentinel_due
from tuner.eta import RunClock
from tuner.measurement.failures import FailureReason, TrialFailure
from tuner.prepare import StudyContext
from tuner.progress import Progress
from tuner.run.trial_measurement import Interrupted, TrialHooks, TrialMeasurement, describe_trial
from tuner.search.space import baseline_config, suggest
from tuner.storage import store
from tuner.storage.coordination import failed_elsewhere, tally, worker_id
from tuner.storage.journal import Journal
from tuner.storage.records import SearchNote, TrialRecord


class FailedElsewhere(Exception):
    """This process's trial was failed as dead by another worker: nothing of it is stored (see
    ``coordination.failed_elsewhere``); the run goes on with the next trial."""


class StudyObjective:
    """The Optuna objective: one trial = one configuration suggested, measured (``run/trial_measurement``),
    stored."""

    def __init__(
        self, ctx: StudyContext, study: optuna.Study, progress: Progress, journal: Journal | None = None
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
        search: SearchNote = {"stage": stage, "reason": reason} if stage else {}
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
        assert values is not None  # neither pruned nor failed: complete
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


class ProcessTrials:
    """This process's trials: the baseline re-measured when a sentinel is due, then one Optuna trial at a
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
        self.objective = StudyObjective(ctx, study, progress, journal)
        self.said_disturbed = False

    def report(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """Optuna's callback after each trial: the progress line with the best so far."""
        self.journal.stored(trial.number)
        best = store.best_feasible(study)
        best_text = "no feasible trial yet"
        if best:
            assert best.metrics is not None  # a feasible trial is complete
            best_text = f"best feasible {best.metrics.tokens_per_second:.1f} t/s (trial {best.number})"
        record = store.read_trial(trial)
        why = f" [{record.search['stage']}: {record.search['reason']}]" if record.search else ""
        counted = tally(study).counted
        self.clock.replan(counted)
        self.progress(
            f"[{counted}/{self.budget}] trial {trial.number}{why}: {describe_trial(record)} | {best_text}"
        )

    def say_if_disturbed(self) -> None:
        """One line, once, when the sentinels first contradict the baseline's first reading."""
        if self.said_disturbed:
            return
        records = store.read_trials(self.study)
        disturbed = Sentinels(records, self.ctx.settings.noise_cv).disturbed_baseline(worker_id())
        if disturbed is not None:
            self.said_disturbed = True
            self.progress(f"baseline: {disturbed.text()}")

    def run_one(self) -> None:
        """A sentinel if one is due, then one trial (a trial another worker failed is said, not raised)."""
        study, objective = self.study, self.objective
        if sentinel_due(store.read_trials(study), worker_id(), self.ctx.spec.sentinel, time.time()):
            sentinel = describe_trial(objective.run_sentinel())
            self.clock.replan(tally(study).counted)
            self.progress(f"sentinel: {sentinel}")
            self.say_if_disturbed()
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
