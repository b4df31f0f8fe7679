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
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import optuna

from tuner.context import StudyContext, check_lines, prepare, study_estimate
from tuner.decisions.drift import Sentinels, midpoint, sentinel_due
from tuner.decisions.race import describe as describe_race
from tuner.decisions.race import race_study
from tuner.errors import UserError
from tuner.eta import Estimate, Progress, as_progress
from tuner.knobs.config import TrialConfig
from tuner.machine import hostlock
from tuner.machine.host import busy_processes, cpu_seconds_by_process, host_was_busy, trial_host_state
from tuner.machine.placement import contradiction, evict, read_numa_maps, read_smaps_rollup
from tuner.machine.roofline import Bandwidth, impossible, last_level_cache_bytes, study_roofline
from tuner.measurement import quality as quality_scorers
from tuner.measurement.failures import PERMANENT, FailureReason, TrialFailure
from tuner.measurement.launch import build_server_command, model_flags
from tuner.measurement.load import run_levels
from tuner.measurement.measure import Sample, outputs_by_prompt, run_workload, score_trial, summarize
from tuner.measurement.quality import repeated_output
from tuner.measurement.runner import LlamaServer, free_port, read_log_tail
from tuner.search.prior import describe as describe_prior
from tuner.search.prior import find_prior
from tuner.search.pruning import may_prune, prunes_on, should_prune
from tuner.search.sampling import sampler_for
from tuner.search.space import baseline_config, suggest
from tuner.storage import outage, store
from tuner.storage.coordination import (
    ensure_baseline,
    fail_orphans,
    failed_elsewhere,
    hold_sqlite_study,
    make_storage,
    run_until_budget,
    safe_url,
    tally,
    worker_id,
)
from tuner.storage.journal import Journal
from tuner.storage.records import (
    Failure,
    Metrics,
    Reference,
    Spread,
    StudyRecord,
    TrialRecord,
    changes,
    digest,
)
from tuner.studyfile.spec import StudySpec, load_spec

INIT_WAIT_S = 10.0  # how long a joining worker waits for the study's creator to record the study


def open_study(ctx: StudyContext) -> optuna.Study:
    """Create or resume; refuse to add trials whose numbers would not compare with the stored ones.

    Of several workers starting at once exactly one creates the study (and later runs the
    baseline, see ``tuner.storage.coordination``); the others wait for it to record the study.
    """
    spec = ctx.spec
    storage = make_storage(spec.storage, spec.workers)
    directions = [o.direction for o in spec.objectives]
    try:  # creation is atomic: with several workers starting at once, exactly one creates
        study = optuna.create_study(
            study_name=spec.name, storage=storage, directions=directions, sampler=make_sampler(spec)
        )
        store.set_created_by(study, worker_id())
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=spec.name, storage=storage, sampler=make_sampler(spec))
    if list(study.directions) != [optuna.study.StudyDirection[d.upper()] for d in directions]:
        raise UserError(
            f"{spec.path}: objectives: study {spec.name!r} exists with other objective directions; use a new name"
        )
    waited = time.monotonic() + INIT_WAIT_S
    while (
        not store.has_study_record(study)
        and store.created_by(study) != worker_id()
        and time.monotonic() < waited
    ):
        time.sleep(0.2)  # joining a study whose creator is recording it right now
    if not store.has_study_record(study):  # created here, or its creator died before recording it
        store.set_created_by(study, worker_id())
        record = ctx.study_record(worker_id())
        store.write_study_record(study, record)
        prior = (
            find_prior(storage, record, ctx.space) if spec.reuse and spec.sampler == "structured" else None
        )
        if prior:
            store.write_prior(study, prior)
        return study
    refuse_incomparable(ctx, store.read_study_record(study))
    return study


def refuse_incomparable(ctx: StudyContext, stored: StudyRecord) -> None:
    """One line naming what changed since the study was stored, and how to start a new one."""
    changed = changes(stored, ctx.study_record(stored.created_by))
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise UserError(
            f"{ctx.spec.path}: study {ctx.spec.name!r} exists and its {changed[0]}{more}: new trials would not "
            f"compare with its stored ones; revert the change, or start a new study by changing `name:`"
        )


def make_sampler(spec: StudySpec) -> optuna.samplers.BaseSampler:
    return sampler_for(spec.sampler, spec.seed, spec.budget_trials)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a trial, carrying the trial's record (failed as interrupted)."""

    def __init__(self, record: TrialRecord):
        super().__init__()
        self.record = record


class Pruned(Exception):
    """The incumbent cannot be beaten: the samples so far and why."""

    def __init__(self, samples: list[Sample], reason: str):
        super().__init__(reason)
        self.samples = samples
        self.reason = reason


class FailedElsewhere(Exception):
    """This process's trial was failed as dead by another worker: nothing of it is stored (see
    ``coordination.failed_elsewhere``); the run goes on with the next trial."""


class TrialRunner:
    """The objective: one trial = one launch, one workload, one record stored."""

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
        self._reference: Reference | None = None  # a baseline's, stored with its record
        self.failed_elsewhere: str | None = None  # why the last trial's measurement was dropped
        bandwidth = ctx.fingerprint.get("bandwidth_bytes_per_s")
        self.roofline = (
            study_roofline(ctx.study_record(worker_id()), Bandwidth(bandwidth, "fingerprint", ""))
            if bandwidth
            else None
        )
        self.llc_bytes = last_level_cache_bytes()
        self.placed_under: str | None = None  # the NUMA policy the models' cached pages were placed under

    def __call__(self, trial: optuna.Trial) -> tuple[float, ...]:
        config = suggest(trial, self.ctx.space)
        self._reference = None
        try:
            record = self.measure(
                config,
                store.role_of(trial),
                trial.number,
                on_running=lambda port: store.mark_running(trial, worker_id(), port),
                on_pass=self._reporter(trial),
            )
        except Interrupted as stop:
            self._store(trial, stop.record, None)
            raise
        lost = failed_elsewhere(self.study, trial, self.ctx.spec.workers)
        if lost is not None:
            self.failed_elsewhere = lost
            raise FailedElsewhere(lost)
        stage, reason = store.search_note(trial)
        record = replace(record, search={"stage": stage, "reason": reason} if stage else {})
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
        reference, self._reference = self._reference, None
        if self.journal is not None:
            self.journal.keep(trial, record, values, reference)
        if reference is not None:
            store.write_reference(self.study, reference)
        if record.complete:
            # Feasible when <= 0: samplers read them from here, and nothing below the floor is reported as best.
            for name, value in (record.constraints or {"quality_floor": record.constraint}).items():
                trial.set_constraint(name, value)
        store.write_trial_record(trial, record)

    def measure(
        self,
        config: TrialConfig,
        role: str,
        number: int | None,
        on_running: Callable[[int], None] = lambda port: None,
        on_pass: Callable[[int, float], None] = lambda step, rate: None,
    ) -> TrialRecord:
        """One configuration measured into a COMPLETE, PRUNED or FAIL record (``Interrupted`` on Ctrl-C);
        ``on_pass(passes done, running tokens/s)`` after every pass."""
        started, wall_start = time.monotonic(), time.time()
        log_path = self.ctx.log_dir / (
            f"trial-{number}.log" if number is not None else f"sentinel-{wall_start:.0f}.log"
        )
        record = TrialRecord(
            number=number if number is not None else -1,
            state="RUNNING",
            role=role,
            config=config,
            worker=worker_id(),
            started_at=wall_start,
        )
        try:
            known = self._known_permanent_failure(config)
            if known:
                raise TrialFailure(
                    FailureReason(known.failure.reason),
                    f"same configuration already failed permanently in trial {known.number}",
                    known.log_tail,
                )
            record = replace(record, command=build_server_command(config, self.ctx.launch))
            record = self._measure(record, log_path, on_running, on_pass)
        except (TrialFailure, KeyboardInterrupt) as err:
            failure = (
                err
                if isinstance(err, TrialFailure)
                else TrialFailure(
                    FailureReason.INTERRUPTED,
                    "interrupted by the user or SIGTERM",
                    read_log_tail(log_path, 40),
                )
            )
            record = replace(
                record,
                state="FAIL",
                failure=Failure(failure.reason.value, failure.detail),
                log_tail=failure.log_tail or record.log_tail,
            )
            if not isinstance(err, TrialFailure):
                raise Interrupted(
                    replace(record, duration_s=time.monotonic() - started, ended_at=time.time())
                ) from err
        return replace(record, duration_s=time.monotonic() - started, ended_at=time.time())

    def _place(self, config: TrialConfig) -> bool:
        """Evict the models' cached pages when the NUMA policy changes (see tuner.machine.placement)."""
        evicted = self.placed_under is not None and config.numa != self.placed_under
        if evicted:
            launch = self.ctx.launch
            evict([launch.target, *launch.drafts.values()])
        self.placed_under = config.numa
        return evicted

    def _measure(
        self,
        record: TrialRecord,
        log_path: Path,
        on_running: Callable[[int], None],
        on_pass: Callable[[int, float], None],
    ) -> TrialRecord:
        ctx, config = self.ctx, record.config
        ctx.log_dir.mkdir(parents=True, exist_ok=True)
        timeout = ctx.settings.trial_timeout_s
        evicted = self._place(config)
        models = [ctx.launch.target, *ctx.launch.drafts.values()]
        before, wall = cpu_seconds_by_process(), time.monotonic()
        # read before measuring: from the measurement on, storage is written only after the journal
        reference = None if record.role == "baseline" else store.read_reference(self.study)
        records = store.read_trials(self.study)
        sentinels = Sentinels(records, ctx.settings.noise_cv)
        reference_rate = None  # a baseline or sentinel is its own reference
        if record.role not in (
            "baseline",
            "sentinel",
        ):  # this worker's latest reference: the speedup known now
            reference_rate = sentinels.rate_at(worker_id(), time.time()) or (
                reference.tokens_per_second if reference else None
            )
        prune = (
            ctx.spec.prune and may_prune(record.role) and prunes_on([o.metric for o in ctx.spec.objectives])
        )
        incumbent = store.best_of(records) if prune else None
        against = drift_corrected(incumbent, sentinels) if incumbent is not None else []
        # the incumbent ran in another launch: allow the spread this host's sentinels show between launches
        launch_sigma = sentinels.launch_spread(worker_id())
        planned = len(ctx.workload.prompts) * ctx.settings.repetitions

        def after_request(samples: list[Sample], pass_done: bool, more: bool) -> None:
            """Running tokens/s after a pass; before another request, stop once it cannot beat the incumbent."""
            if pass_done:
                on_pass(
                    len({s.repetition for s in samples}), summarize(samples, ctx.settings).tokens_per_second
                )
            if incumbent is not None and more:
                decision = should_prune(
                    [sample_record(s) for s in samples],
                    against,
                    record.role,
                    planned,
                    launch_sigma=launch_sigma,
                )
                if decision.prune:
                    raise Pruned(samples, f"against trial {incumbent.number}: {decision.reason}")

        try:
            with LlamaServer(
                record.command.argv, free_port(), log_path, ready_timeout_s=timeout, request_timeout_s=timeout
            ) as server:
                on_running(server.port)
                samples = run_workload(
                    server,
                    ctx.workload,
                    ctx.settings,
                    config.temperature,
                    after_request=after_request,
                    speculative=config.speculative,
                )
                levels = run_levels(
                    server,
                    ctx.workload.prompts,
                    ctx.spec.load_levels,
                    ctx.settings.n_predict,
                    config.temperature,
                    ctx.settings.seed,
                )
                busy = busy_processes(
                    before, cpu_seconds_by_process(), time.monotonic() - wall, {os.getpid(), server.pid}
                )
                pages = read_numa_maps(server.pid, models)
                memory = read_smaps_rollup(server.pid)  # which pages were huge (THP), locked
                spec_problem = server.speculation_log_problem()
                log_tail = server.log_tail()
        except Pruned as pruned:
            scores = summarize(pruned.samples, ctx.settings)
            return replace(
                record,
                state="PRUNED",
                pruned=pruned.reason,
                metrics=Metrics(scores.tokens_per_second, scores.acceptance, 0.0, 0.0),
                spread=Spread(scores.repetitions, scores.cv, scores.noisy),
                drafted=scores.drafted,
                accepted=scores.accepted,
                samples=tuple(sample_record(s) for s in pruned.samples),
                log_tail=read_log_tail(log_path, 40),
            )
        scores = score_trial(
            samples, ctx.settings, config.speculative, ",".join(config.spec_types), spec_problem, log_tail
        )
        if not config.speculative and self.roofline is not None:
            why = impossible(scores.tokens_per_second, self.roofline, config.experts, self.llc_bytes)
            if why:
                raise TrialFailure(FailureReason.ABOVE_ROOFLINE, why, log_tail)
        outputs = outputs_by_prompt(samples)
        if record.role == "baseline":  # the study's reference, stored with this trial's record
            self._reference = reference = Reference(
                trial=record.number,
                tokens={pid: list(s.tokens) for pid, s in outputs.items()},
                texts={pid: s.text for pid, s in outputs.items()},
                tokens_per_second=scores.tokens_per_second,
            )
        quality, extra_scores = self._quality(config, outputs, reference)
        extra_scores = {**extra_scores, "repeated_output": repeated_output(s.text for s in outputs.values())}
        reference_rate = (
            reference_rate or scores.tokens_per_second
        )  # a baseline or sentinel is its own reference
        host = trial_host_state(ctx.launch.topology, busy)
        host.update(
            evicted_pages=evicted,
            numa_pages={Path(f).name: n for f, n in pages.items()},
            smaps_kib=memory,
            placement_problem=contradiction(
                config.numa, config.numa_node, pages, len(ctx.launch.topology.nodes)
            ),
        )
        return replace(
            record,
            state="COMPLETE",
            metrics=Metrics(
                tokens_per_second=scores.tokens_per_second,
                acceptance=scores.acceptance,
                quality=quality,
                speedup=scores.tokens_per_second / reference_rate if reference_rate else 1.0,
            ),
            spread=Spread(scores.repetitions, scores.cv, scores.noisy),
            drafted=scores.drafted,
            accepted=scores.accepted,
            per_suite_tokens_per_second=scores.per_suite_tokens_per_second,
            per_turn_tokens_per_second={str(t): v for t, v in scores.per_turn_tokens_per_second.items()},
            samples=tuple(sample_record(s) for s in samples),
            outputs={pid: s.text for pid, s in outputs.items()},
            load=tuple(level.summary() for level in levels),
            **self._constraints(quality, extra_scores, levels),
            log_tail=log_tail,
            host=host,
            scores=extra_scores,
        )

    def run_sentinel(self) -> TrialRecord:
        """The baseline configuration re-measured now, stored as a trial of role sentinel."""
        base = store.baseline_trial(self.study)
        record = self.measure(baseline_config(self.ctx.space), "sentinel", None)
        values = None if record.failure else [record.objective(o.metric) for o in self.ctx.spec.objectives]
        return store.add_measured_trial(self.study, record, base.params, base.distributions, values)

    def _quality(self, config: TrialConfig, outputs: dict, reference: Reference | None) -> tuple[float, dict]:
        """The trial's quality, and the scorer's other figures (kld: mean_kld, same_top)."""
        scorer = self.ctx.spec.quality.scorer
        if scorer == "perplexity":
            return quality_scorers.perplexity_ratio(
                self._perplexity(baseline_config(self.ctx.space)), self._perplexity(config)
            ), {}
        if scorer == "kld":
            scores = self._kld(config)
            return scores["same_top"], scores
        return quality_scorers.output_quality(
            scorer, outputs, self.ctx.workload, reference.tokens if reference else {}
        ), {}

    def _constraints(self, quality: float, scores: dict, levels: list) -> dict:
        """The record's ``constraint`` (feasible when <= 0: every bound met) and, with load bounds, each one
        by name (``quality_floor``, ``p95_ttft_ms_c4``, ...) for Optuna and the report."""
        floor = self._constraint(quality, scores)
        by_users = {level.users: level.summary() for level in levels}
        named = {c.name: c.violation(by_users[c.users][c.metric]) for c in self.ctx.spec.constraints}
        if not named:
            return {"constraint": floor}
        return {"constraint": max(floor, *named.values()), "constraints": {"quality_floor": floor, **named}}

    def _constraint(self, quality: float, scores: dict) -> float:
        """Feasible when <= 0: quality at or above the floor and, for kld, mean KLD at or below max_kld."""
        spec = self.ctx.spec.quality
        constraint = spec.floor - quality
        if spec.max_kld is not None and "mean_kld" in scores:
            constraint = max(constraint, scores["mean_kld"] - spec.max_kld)
        return constraint

    def _model_flags(self, config: TrialConfig) -> list[str]:
        """What the model computes (experts), with the baseline's threads: speculation, temperature and
        threads do not change the logits, so text scorers run once per distinct expert count."""
        baseline = baseline_config(self.ctx.space)
        return model_flags(replace(config, threads=baseline.threads, threads_batch=None), self.ctx.launch)

    def _kld(self, config: TrialConfig) -> dict:
        """KL divergence from the baseline's logits, saved once per study in its log folder, keyed by the
        baseline's model flags and the text file's digest (a changed text or model makes a new base)."""
        ctx = self.ctx
        flags = self._model_flags(config)
        key = " ".join(flags)
        cache = store.kld_cache(self.study)
        if key not in cache:
            text_file = ctx.spec.quality.text_file
            base_flags = self._model_flags(baseline_config(ctx.space))
            if flags == base_flags:  # the baseline's own model: zero by definition (a rerun differs by
                return {"mean_kld": 0.0, "same_top": 1.0}  # batch-order rounding only, ~1e-6)
            base_key = digest([base_flags, hashlib.sha256(text_file.read_bytes()).hexdigest()])
            base = quality_scorers.save_kld_base(
                base_flags,
                text_file,
                ctx.log_dir / f"kld-base-{base_key}.bin",
                bin_dir=ctx.launch.server_binary.parent,
                timeout_s=ctx.settings.trial_timeout_s,
            )
            cache[key] = quality_scorers.measure_kld(
                flags, base, bin_dir=ctx.launch.server_binary.parent, timeout_s=ctx.settings.trial_timeout_s
            )
            store.write_kld_cache(self.study, cache)
        return cache[key]

    def _perplexity(self, config: TrialConfig) -> float:
        """Perplexity depends only on the model flags (experts), not on speculation or
        temperature or threads, so it is measured once per distinct expert count."""
        flags = self._model_flags(config)
        key = " ".join(flags)
        cache = store.perplexity_cache(self.study)
        if key not in cache:
            cache[key] = quality_scorers.measure_perplexity(
                flags,
                self.ctx.spec.quality.text_file,
                bin_dir=self.ctx.launch.server_binary.parent,
                timeout_s=self.ctx.settings.trial_timeout_s,
            )
            store.write_perplexity_cache(self.study, cache)
        return cache[key]

    def _known_permanent_failure(self, config: TrialConfig) -> TrialRecord | None:
        """A configuration that failed for a reason that will not change is not relaunched."""
        permanent = {r.value for r in PERMANENT}
        for past in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)):
            record = store.read_trial(past)
            if record.config == config and record.failure and record.failure.reason in permanent:
                return record
        return None


def drift_corrected(incumbent: TrialRecord, sentinels: Sentinels) -> list[dict]:
    """The incumbent's samples as the machine would measure them now: scaled by this worker's
    reference rate now over the reference rate when the incumbent ran (tuner.decisions.drift), so a
    machine that slowed down since does not prune everything after it. Reports divide by the
    sentinels interpolated at each trial's time."""
    now, then = sentinels.rate_at(worker_id(), time.time()), None
    if midpoint(incumbent) is not None:
        then = sentinels.rate_at(incumbent.worker, midpoint(incumbent))
    scale = now / then if now and then else 1.0
    return [{**s, "tokens_per_second": s["tokens_per_second"] * scale} for s in incumbent.samples]


def sample_record(sample: Sample) -> dict:
    """A raw per-request sample for the trial's record (tokens and text left out: see outputs)."""
    return {k: v for k, v in asdict(sample).items() if k not in ("tokens", "text")}


def describe_trial(record: TrialRecord) -> str:
    knobs = " ".join(f"{k}={v}" for k, v in record.config.as_dict().items())
    if record.state == "PRUNED":
        return f"PRUNED at {record.metrics.tokens_per_second:.1f} t/s ({record.pruned}) | {knobs}"
    if record.complete:
        m = record.metrics
        flag = " (noisy)" if record.spread and record.spread.noisy else ""
        if record.host and host_was_busy(record.host):
            others = {k: v for k, v in record.host["busy_processes"].items() if k != "all others"}
            flag += f" (host busy: {', '.join(others) or 'many small processes'})"
        return (
            f"{m.tokens_per_second:.1f} t/s{flag}, x{m.speedup:.2f}, acceptance {m.acceptance:.2f}, "
            f"quality {m.quality:.3f} | {knobs}"
        )
    failure = record.failure or Failure("error", "")
    return f"FAILED ({failure.reason}: {failure.detail}) | {knobs}"


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


class RunClock:
    """The time left in a run, planned on its Progress: the trials not yet counted at the time per trial
    measured so far in this run (the estimate before the first), then the race, scaled by how far the
    measured trials are off the estimate. The scaled launch time is left for the race (``unit_s``)."""

    def __init__(
        self, progress: Progress, estimate: Estimate, budget: int, race: bool, deadline: float | None
    ):
        self.progress, self.estimate, self.budget, self.race, self.deadline = (
            progress,
            estimate,
            budget,
            race,
            deadline,
        )
        self.first: tuple[int, float] | None = None  # trials counted, and when, at the first plan

    def replan(self, counted: int) -> None:
        now = time.monotonic()
        self.first = self.first or (counted, now)
        done = counted - self.first[0]
        planned = self.estimate.trials_s / max(self.estimate.trials, 1)  # sentinels included
        per_trial = (now - self.first[1]) / done if done > 0 else planned
        trials_s = max(0, self.budget - counted) * per_trial
        if self.deadline is not None:
            trials_s = min(trials_s, max(0.0, self.deadline - now))
        scale = min(10.0, max(0.1, per_trial / planned)) if planned else 1.0
        self.progress.unit_s = self.estimate.launch_s * scale
        self.progress.plan(trials_s + (self.estimate.race_s * scale if self.race else 0.0))


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


def _run_locked(
    ctx: StudyContext, journal: Journal, trials: int | None, progress: Progress, race: bool
) -> optuna.Study:
    spec = ctx.spec
    lock = hold_sqlite_study(spec.storage, spec.name)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # our progress line replaces Optuna's
    try:
        study = open_study(ctx)
        progress.sink = lambda figures: store.write_progress(study, {"command": "tuner run", **figures})
        journal.replay(study, progress)  # trials measured before a storage outage, before orphans are failed
        if store.created_by(study) != worker_id():
            study.sampler.reseed_rng()  # a joining worker or a resumed run must not replay the creator's proposals
        if lock:
            fail_orphans(study, spec.workers, progress)
        budget = trials or spec.budget_trials
        objective = TrialRunner(ctx, study, progress, journal)
        deadline = time.monotonic() + spec.budget_minutes * 60 if spec.budget_minutes else None
        clock = RunClock(progress, study_estimate(ctx), budget, race, deadline)
        clock.replan(tally(study).counted)
        _starting_notes(ctx, study, progress)

        def report(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
            journal.stored(trial.number)
            best = store.best_feasible(study)
            best_text = (
                f"best feasible {best.metrics.tokens_per_second:.1f} t/s (trial {best.number})"
                if best
                else "no feasible trial yet"
            )
            record = store.read_trial(trial)
            why = f" [{record.search['stage']}: {record.search['reason']}]" if record.search else ""
            counted = tally(study).counted
            clock.replan(counted)
            progress(
                f"[{counted}/{budget}] trial {trial.number}{why}: {describe_trial(record)} | {best_text}"
            )

        def run_one() -> None:
            if sentinel_due(store.read_trials(study), worker_id(), spec.sentinel, time.time()):
                sentinel = describe_trial(objective.run_sentinel())
                clock.replan(tally(study).counted)
                progress(f"sentinel: {sentinel}")
            timeout = max(1.0, deadline - time.monotonic()) if deadline else None
            objective.failed_elsewhere = None
            try:
                study.optimize(
                    objective, n_trials=1, timeout=timeout, catch=(TrialFailure,), callbacks=[report]
                )
            except (
                FailedElsewhere,
                ValueError,
            ):  # Optuna cannot tell a trial another worker failed: ValueError
                if objective.failed_elsewhere is None:
                    raise
                progress(objective.failed_elsewhere)

        done = tally(study).counted
        progress(f"study {spec.name}: {done} of {budget} trials done; storage {safe_url(spec.storage)}")
        if done < budget:
            ensure_baseline(study, ctx, run_one, progress)
            run_until_budget(study, run_one, budget, spec.workers, deadline, progress)
        if race:
            result = race_study(ctx, study, progress)
            for line in (
                describe_race(result) if result else ["race: no feasible trial besides the baseline to race"]
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
        ctx = prepare(spec)
        print(
            json.dumps(
                {
                    "study": spec.name,
                    "space": ctx.space.describe(),
                    "notes": list(ctx.space.notes),
                    "drafts": list(ctx.drafts),
                    "prompts": len(ctx.workload.prompts),
                    **({"concurrency": list(spec.load_levels)} if spec.load_levels else {}),
                    **(
                        {"constraints": {c.name: c.limit for c in spec.constraints}}
                        if spec.constraints
                        else {}
                    ),
                },
                indent=2,
                default=str,
            )
        )
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
