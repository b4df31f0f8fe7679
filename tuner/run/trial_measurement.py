"""One trial's measurement, in the steps ARCHITECTURE.md draws: place -> references -> serve and
measure -> score -> check -> record.

``TrialMeasurement.measure(config, role, number, hooks)`` turns one configuration into its
``TrialRecord`` (COMPLETE, PRUNED or FAIL; ``Interrupted`` on Ctrl-C). The study's Optuna objective
(``run/objective.StudyObjective``) stores what it returns; sentinels measure through it too. Why a module
of its own: the objective's bookkeeping (Optuna, storage, progress) and the measurement change for
different reasons, and a reader follows one trial here from launch to record.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import optuna

from tuner.decisions.drift import Sentinels, midpoint
from tuner.knobs.config import TrialConfig
from tuner.machine.host import busy_text, host_was_busy, trial_host_state
from tuner.machine.placement import contradiction, evict
from tuner.machine.roofline import Bandwidth, impossible, last_level_cache_bytes, study_roofline
from tuner.measurement import quality as quality_scorers
from tuner.measurement.failures import PERMANENT, FailureReason, TrialFailure
from tuner.measurement.launch import build_server_command, model_flags
from tuner.measurement.measure import Sample, Scores, outputs_by_prompt, score_trial, summarize
from tuner.measurement.measured_launch import MeasuredLaunch, Requests, ServerLaunch, measured_launch
from tuner.measurement.quality import ScorerFigures, repeated_output
from tuner.measurement.server_process import read_log_tail
from tuner.prepare import StudyContext
from tuner.prepare.memory import config_misfit
from tuner.search.pruning import may_prune, prunes_on, should_prune
from tuner.search.space import baseline_config
from tuner.storage import store
from tuner.storage.coordination import worker_id
from tuner.storage.records import Failure, Metrics, Reference, SearchNote, Spread, TrialRecord, digest

LOG_TAIL_LINES = 40


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


@dataclass(frozen=True)
class TrialHooks:
    """What the caller learns while a trial runs: the server's port once it is up, and the running
    tokens/s after every pass (passes done, rate)."""

    on_running: Callable[[int], None] = lambda port: None
    on_pass: Callable[[int, float], None] = lambda step, rate: None


@dataclass(frozen=True)
class References:
    """What a trial is compared with, read before it measures (from then on storage is written only
    after the journal): the quality reference, the speed reference now, and the incumbent to prune on."""

    reference: Reference | None
    reference_rate: float | None  # None for a baseline or sentinel: it is its own reference
    incumbent: TrialRecord | None = None  # None: not pruned
    against: list[dict] = field(default_factory=list)  # the incumbent's samples, drift-corrected
    launch_sigma: float = 0.0  # the spread this host's sentinels show between launches


class TrialMeasurement:
    """Measures configurations of one study on this host, one launch each; keeps what lasts across
    trials: the roofline, the NUMA policy the models' pages were placed under, and the baseline's
    reference just measured (``new_reference``, for the caller to store with its record)."""

    def __init__(self, ctx: StudyContext, study: optuna.Study):
        self.ctx, self.study = ctx, study
        bandwidth = ctx.fingerprint.get("bandwidth_bytes_per_s")
        self.roofline = (
            study_roofline(ctx.study_record(worker_id()), Bandwidth(bandwidth, "fingerprint", ""))
            if bandwidth
            else None
        )
        self.llc_bytes = last_level_cache_bytes()
        self.placed_under: str | None = None
        self.new_reference: Reference | None = None
        self.model_scores = ModelScores(ctx, study)

    def measure(
        self,
        config: TrialConfig,
        role: str,
        number: int | None,
        hooks: TrialHooks = TrialHooks(),
        search: SearchNote | None = None,
    ) -> TrialRecord:
        """One configuration measured into a COMPLETE, PRUNED or FAIL record (``Interrupted`` on Ctrl-C);
        ``search``: the sampler's stage and reason for it (a hardware trial is never pruned)."""
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
            search=search or {},
        )
        try:
            self._refuse_known_failure(config)
            record = replace(record, command=build_server_command(config, self.ctx.launch))
            misfit = config_misfit(self.ctx, config)
            if misfit:  # never launched: it would swap or be killed, and disturb what is measured after it
                raise TrialFailure(FailureReason.DOES_NOT_FIT, f"does not fit in memory: {misfit}")
            record = self._steps(record, log_path, hooks)
        except (TrialFailure, KeyboardInterrupt) as err:
            record = _failed(record, err, log_path)
            if not isinstance(err, TrialFailure):
                raise Interrupted(
                    replace(record, duration_s=time.monotonic() - started, ended_at=time.time())
                ) from err
        return replace(record, duration_s=time.monotonic() - started, ended_at=time.time())

    def _steps(self, record: TrialRecord, log_path: Path, hooks: TrialHooks) -> TrialRecord:
        """place -> references -> serve and measure -> score and check -> record."""
        self.ctx.log_dir.mkdir(parents=True, exist_ok=True)
        evicted = self._place(record.config)
        refs = self._references(record)
        try:
            served = self._serve(record, log_path, refs, hooks)
        except Pruned as pruned:
            return _pruned(record, pruned, self.ctx, log_path)
        scores = self._score(record.config, served)
        return self._record(record, served, scores, refs, evicted)

    def _place(self, config: TrialConfig) -> bool:
        """Evict the models' cached pages when the NUMA policy changes (see tuner.machine.placement)."""
        evicted = self.placed_under is not None and config.numa != self.placed_under
        if evicted:
            launch = self.ctx.launch
            evict([launch.target_file(config), *launch.drafts.values()])
        self.placed_under = config.numa
        return evicted

    def _references(self, record: TrialRecord) -> References:
        """The quality reference, this worker's speed reference now (the sentinels interpolated), and
        the incumbent a prunable trial must be able to beat."""
        ctx = self.ctx
        own = record.role in ("baseline", "sentinel")
        reference = None if record.role == "baseline" else store.read_reference(self.study)
        records = store.read_trials(self.study)
        sentinels = Sentinels(records, ctx.settings.noise_cv)
        rate = None
        if not own:
            rate = sentinels.rate_at(worker_id(), time.time()) or (
                reference.tokens_per_second if reference else None
            )
        objectives = [o.metric for o in ctx.spec.objectives]
        if not (
            ctx.spec.prune and may_prune(record.role, record.search.get("stage")) and prunes_on(objectives)
        ):
            return References(reference, rate)
        incumbent = store.best_of(records)
        if incumbent is None:
            return References(reference, rate)
        # the incumbent ran in another launch: allow the spread this host's sentinels show between launches
        return References(
            reference,
            rate,
            incumbent,
            drift_corrected(incumbent, sentinels),
            sentinels.launch_spread(worker_id()),
        )

    def _after_request(self, record: TrialRecord, refs: References, hooks: TrialHooks):
        """The workload's hook: the running rate after a pass; before another request, stop once the
        trial cannot beat the incumbent."""
        settings = self.ctx.settings
        planned = self.ctx.workload.requests_per_pass * settings.repetitions

        def after_request(samples: list[Sample], pass_done: bool, more: bool) -> None:
            if pass_done:
                hooks.on_pass(
                    len({s.repetition for s in samples}), summarize(samples, settings).tokens_per_second
                )
            if refs.incumbent is not None and more:
                decision = should_prune(
                    [sample_record(s) for s in samples],
                    refs.against,
                    record.role,
                    planned,
                    launch_sigma=refs.launch_sigma,
                )
                if decision.prune:
                    raise Pruned(samples, f"against trial {refs.incumbent.number}: {decision.reason}")

        return after_request

    def _serve(
        self, record: TrialRecord, log_path: Path, refs: References, hooks: TrialHooks
    ) -> MeasuredLaunch:
        """One pinned llama-server: the workload, the load levels, and what the host did meanwhile."""
        ctx, config = self.ctx, record.config
        assert record.command is not None  # built before the first step
        return measured_launch(
            ServerLaunch(
                record.command.argv,
                log_path,
                timeout_s=ctx.settings.trial_timeout_s,
                models=[ctx.launch.target_file(config), *ctx.launch.drafts.values()],
            ),
            requests=Requests(
                ctx.workload,
                ctx.settings,
                config.temperature,
                levels=ctx.spec.load_levels,
                speculative=config.speculative,
                after_request=self._after_request(record, refs, hooks),
            ),
            on_running=hooks.on_running,
        )

    def _score(self, config: TrialConfig, served: MeasuredLaunch) -> Scores:
        """The scores, checked: speculation that drafted nothing and a rate above the roofline fail."""
        scores = score_trial(
            served.samples,
            self.ctx.settings,
            config.speculative,
            ",".join(config.spec_types),
            served.spec_problem,
            served.log_tail,
        )
        if not config.speculative and self.roofline is not None:
            target = self.ctx.target_for(config)  # a quantized variant reads fewer bytes: its own ceiling
            roofline = replace(
                self.roofline,
                weights_bytes=target.weights_bytes,
                expert_bytes=target.expert_weights_bytes if self.roofline.expert_bytes else None,
            )
            why = impossible(scores.tokens_per_second, roofline, config.experts, self.llc_bytes)
            if why:
                raise TrialFailure(FailureReason.ABOVE_ROOFLINE, why, served.log_tail)
        return scores

    def _record(
        self, record: TrialRecord, served: MeasuredLaunch, scores: Scores, refs: References, evicted: bool
    ) -> TrialRecord:
        """Quality against the reference (a baseline becomes it), the host's state, the complete record."""
        ctx, config = self.ctx, record.config
        outputs = outputs_by_prompt(served.samples)
        reference = refs.reference
        if record.role == "baseline":  # the study's reference, stored with this trial's record
            self.new_reference = reference = Reference(
                trial=record.number,
                tokens={key: list(s.tokens) for key, s in outputs.items()},
                texts={key: s.text for key, s in outputs.items()},
                tokens_per_second=scores.tokens_per_second,
            )
        quality, extra_scores = self._quality(config, outputs, reference)
        extra_scores = {**extra_scores, "repeated_output": repeated_output(s.text for s in outputs.values())}
        reference_rate = refs.reference_rate or scores.tokens_per_second  # a baseline is its own reference
        host = trial_host_state(ctx.launch.topology, served.busy)
        host.update(
            evicted_pages=evicted,
            numa_pages={Path(f).name: n for f, n in served.pages.items()},
            smaps_kib=served.memory,
            placement_problem=contradiction(
                config.numa, config.numa_node, served.pages, len(ctx.launch.topology.nodes)
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
            samples=tuple(sample_record(s) for s in served.samples),
            outputs={key: s.text for key, s in outputs.items()},
            load=tuple(level.summary() for level in served.levels),
            **self._constraints(quality, extra_scores, served.levels),
            log_tail=served.log_tail,
            host=host,
            scores=extra_scores,
        )

    def _quality(
        self, config: TrialConfig, outputs: dict, reference: Reference | None
    ) -> tuple[float, ScorerFigures]:
        """The trial's quality, and the scorer's other figures (kld: mean_kld, same_top)."""
        scorer = self.ctx.spec.quality.scorer
        if scorer == "perplexity":
            return quality_scorers.perplexity_ratio(
                self.model_scores.perplexity(baseline_config(self.ctx.space)),
                self.model_scores.perplexity(config),
            ), {}
        if scorer == "kld":
            scores = self.model_scores.kld(config)
            return scores["same_top"], scores
        return quality_scorers.output_quality(
            scorer, outputs, self.ctx.workload, reference.tokens if reference else {}
        ), {}

    def _constraints(self, quality: float, scores: ScorerFigures, levels: list) -> dict:
        """The record's ``constraint`` (feasible when <= 0: every bound met) and, with load bounds, each one
        by name (``quality_floor``, ``p95_ttft_ms_c4``, ...) for Optuna and the report."""
        spec = self.ctx.spec.quality
        floor = spec.floor - quality  # and, for kld, mean KLD at or below max_kld
        if spec.max_kld is not None and "mean_kld" in scores:
            floor = max(floor, scores["mean_kld"] - spec.max_kld)
        by_users = {level.users: level.summary() for level in levels}
        named = {c.name: c.violation(by_users[c.users][c.metric]) for c in self.ctx.spec.constraints}
        if not named:
            return {"constraint": floor}
        return {"constraint": max(floor, *named.values()), "constraints": {"quality_floor": floor, **named}}

    def _refuse_known_failure(self, config: TrialConfig) -> None:
        """A configuration that failed for a reason that will not change is not relaunched."""
        permanent = {r.value for r in PERMANENT}
        for past in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)):
            known = store.read_trial(past)
            if known.config == config and known.failure and known.failure.reason in permanent:
                raise TrialFailure(
                    FailureReason(known.failure.reason),
                    f"same configuration already failed permanently in trial {known.number}",
                    known.log_tail,
                )


class ModelScores:
    """Text scorers that depend on the model flags alone (experts), not on speculation, temperature or
    threads: KLD from the baseline's logits and perplexity, each measured once per distinct flags and
    kept in the study's storage."""

    def __init__(self, ctx: StudyContext, study: optuna.Study):
        self.ctx, self.study = ctx, study

    def model_flags(self, config: TrialConfig) -> list[str]:
        """What the model computes (experts), with the baseline's threads: speculation, temperature and
        threads do not change the logits, so text scorers run once per distinct expert count."""
        baseline = baseline_config(self.ctx.space)
        return model_flags(replace(config, threads=baseline.threads, threads_batch=None), self.ctx.launch)

    def _once_per_model(self, config: TrialConfig, read, write, compute):
        """``compute(model flags)``, measured once per distinct model flags and kept in the study
        (``read``/``write`` its cache in storage), as text scorers depend on nothing else."""
        flags = self.model_flags(config)
        key = " ".join(flags)
        cache = read(self.study)
        if key not in cache:
            cache[key] = compute(flags)
            write(self.study, cache)
        return cache[key]

    def kld(self, config: TrialConfig) -> ScorerFigures:
        """KL divergence from the baseline's logits, saved once per study in its log folder, keyed by the
        baseline's model flags and the text file's digest (a changed text or model makes a new base)."""
        ctx = self.ctx
        base_flags = self.model_flags(baseline_config(ctx.space))
        if self.model_flags(config) == base_flags:  # the baseline's own model: zero by definition (a rerun
            return {"mean_kld": 0.0, "same_top": 1.0}  # differs by batch-order rounding only, ~1e-6)
        bin_dir, timeout = ctx.launch.server_binary.parent, ctx.settings.trial_timeout_s

        def compute(flags: list[str]) -> ScorerFigures:
            text_file = ctx.spec.quality.text_file
            assert text_file is not None  # the study file requires one for kld
            base_key = digest([base_flags, hashlib.sha256(text_file.read_bytes()).hexdigest()])
            base = quality_scorers.save_kld_base(
                base_flags,
                text_file,
                ctx.log_dir / f"kld-base-{base_key}.bin",
                bin_dir=bin_dir,
                timeout_s=timeout,
            )
            return quality_scorers.measure_kld(flags, base, bin_dir=bin_dir, timeout_s=timeout)

        return self._once_per_model(config, store.kld_cache, store.write_kld_cache, compute)

    def perplexity(self, config: TrialConfig) -> float:
        """Perplexity depends only on the model flags (experts), not on speculation, temperature or threads."""
        ctx = self.ctx
        text_file = ctx.spec.quality.text_file
        assert text_file is not None  # the study file requires one for perplexity
        return self._once_per_model(
            config,
            store.perplexity_cache,
            store.write_perplexity_cache,
            lambda flags: quality_scorers.measure_perplexity(
                flags,
                text_file,
                bin_dir=ctx.launch.server_binary.parent,
                timeout_s=ctx.settings.trial_timeout_s,
            ),
        )


def _failed(record: TrialRecord, err: BaseException, log_path: Path) -> TrialRecord:
    """A FAIL record: the trial's failure, or an interruption by the user."""
    failure = (
        err
        if isinstance(err, TrialFailure)
        else TrialFailure(
            FailureReason.INTERRUPTED,
            "interrupted by the user or SIGTERM",
            read_log_tail(log_path, LOG_TAIL_LINES),
        )
    )
    return replace(
        record,
        state="FAIL",
        failure=Failure(failure.reason.value, failure.detail),
        log_tail=failure.log_tail or record.log_tail,
    )


def _pruned(record: TrialRecord, pruned: Pruned, ctx: StudyContext, log_path: Path) -> TrialRecord:
    """A PRUNED record: the figures of the requests measured before it was stopped."""
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
        log_tail=read_log_tail(log_path, LOG_TAIL_LINES),
    )


def describe_trial(record: TrialRecord) -> str:
    knobs = " ".join(f"{k}={v}" for k, v in record.config.as_dict().items())
    if record.state == "PRUNED":
        assert record.metrics is not None  # a pruned record has the figures measured before it stopped
        return f"PRUNED at {record.metrics.tokens_per_second:.1f} t/s ({record.pruned}) | {knobs}"
    if record.complete:
        metrics = record.metrics
        assert metrics is not None  # complete means measured
        flag = " (noisy)" if record.spread and record.spread.noisy else ""
        if record.host and host_was_busy(record.host):
            flag += f" ({busy_text(record.host['busy_processes'])})"
        return (
            f"{metrics.tokens_per_second:.1f} t/s{flag}, x{metrics.speedup:.2f}, "
            f"acceptance {metrics.acceptance:.2f}, quality {metrics.quality:.3f} | {knobs}"
        )
    failure = record.failure or Failure("error", "")
    return f"FAILED ({failure.reason}: {failure.detail}) | {knobs}"


def drift_corrected(incumbent: TrialRecord, sentinels: Sentinels) -> list[dict]:
    """The incumbent's samples as the machine would measure them now: scaled by this worker's
    reference rate now over the reference rate when the incumbent ran (tuner.decisions.drift), so a
    machine that slowed down since does not prune everything after it. Reports divide by the
    sentinels interpolated at each trial's time."""
    now, then = sentinels.rate_at(worker_id(), time.time()), None
    incumbent_midpoint = midpoint(incumbent)
    if incumbent_midpoint is not None:
        then = sentinels.rate_at(incumbent.worker, incumbent_midpoint)
    scale = now / then if now and then else 1.0
    return [{**s, "tokens_per_second": s["tokens_per_second"] * scale} for s in incumbent.samples]


def sample_record(sample: Sample) -> dict:
    """A raw per-request sample for the trial's record (tokens and text left out: see outputs)."""
    return {k: v for k, v in asdict(sample).items() if k not in ("tokens", "text")}
