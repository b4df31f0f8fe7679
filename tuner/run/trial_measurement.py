"""One trial's measurement, in the steps ARCHITECTURE.md draws: place -> references (read from the study:
``run/trial_references``) -> serve and measure -> score -> check -> record.

``TrialMeasurement.measure(config, role, number, hooks)`` turns one configuration into its
``TrialRecord`` (COMPLETE, PRUNED or FAIL; ``Interrupted`` on Ctrl-C). The study's Optuna objective
(``run/objective.StudyObjective``) stores what it returns; sentinels measure through it too. Why a module
of its own: the objective's bookkeeping (Optuna, storage, progress) and the measurement change for
different reasons, and a reader follows one trial here from launch to record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import optuna

from tuner.knobs.config import TrialConfig
from tuner.machine.host import busy_text, host_was_busy, trial_host_state
from tuner.machine.placement import contradiction, evict
from tuner.machine.roofline import Bandwidth, impossible, last_level_cache_bytes, study_roofline
from tuner.measurement import quality as quality_scorers
from tuner.measurement.failures import FailureReason, TrialFailure
from tuner.measurement.launch import build_server_command
from tuner.measurement.measure import Sample, Scores, outputs_by_prompt, score_trial, summarize
from tuner.measurement.measured_launch import (
    MeasuredLaunch,
    Requests,
    ServerLaunch,
    StoppedEarly,
    measured_launch,
)
from tuner.measurement.quality import ScorerFigures, repeated_output
from tuner.measurement.server_process import read_log_tail
from tuner.prepare import StudyContext
from tuner.prepare.memory import config_misfit
from tuner.run.trial_references import (
    ModelScores,
    References,
    read_references,
    refuse_known_failure,
    sample_record,
)
from tuner.storage.coordination import worker_id
from tuner.storage.records import Failure, Metrics, Reference, SearchNote, Spread, TrialRecord

LOG_TAIL_LINES = 40
# A launch on a busy host whose reading decides something (the baseline's, every speedup's reference; a pruned
# trial's) is launched again at once, this many times at most (a host busy for good is measured as it is, the
# reading flagged, and the sentinels replace a busy baseline).
BUSY_RELAUNCHES = 1


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a trial, carrying the trial's record (failed as interrupted)."""

    def __init__(self, record: TrialRecord):
        super().__init__()
        self.record = record


class Pruned(StoppedEarly):
    """The incumbent cannot be beaten: the samples so far and why (and the host's state meanwhile: ``busy``)."""

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
            refuse_known_failure(self.study, config)
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
        """place -> references -> serve and measure -> score and check -> record. A launch whose host was busy
        is launched again at once (``BUSY_RELAUNCHES`` times at most) where what it read would decide something:
        the baseline's (every speedup's reference) and a pruned trial's (stopped against a quiet incumbent). The
        readings set aside are kept with the trial (``host["busy_readings"]``); ``drift.Sentinels`` reads a
        reference trial's."""
        self.ctx.log_dir.mkdir(parents=True, exist_ok=True)
        evicted = self._place(record.config)
        refs = read_references(self.ctx, self.study, record)
        busy: list[dict] = []  # the launches set aside on a busy host
        while True:
            launch_log = log_path.with_name(f"{log_path.stem}-relaunch{len(busy)}.log") if busy else log_path
            again = len(busy) < BUSY_RELAUNCHES
            try:
                served = self._serve(record, launch_log, refs, hooks)
            except Pruned as pruned:
                if again and host_was_busy({"busy_processes": pruned.busy}):
                    busy.append(_set_aside(pruned.samples, pruned.busy, self.ctx))
                    continue
                return _kept_aside(_pruned(record, pruned, self.ctx, launch_log), busy)
            if again and record.role == "baseline" and served.host_busy:
                busy.append(_set_aside(served.samples, served.busy, self.ctx))
                continue
            break
        scores = self._score(record.config, served)
        return _kept_aside(self._record(record, served, scores, refs, evicted), busy)

    def _place(self, config: TrialConfig) -> bool:
        """Evict the models' cached pages when the NUMA policy changes (see tuner.machine.placement)."""
        evicted = self.placed_under is not None and config.numa != self.placed_under
        if evicted:
            launch = self.ctx.launch
            evict(launch.model_files(config))
        self.placed_under = config.numa
        return evicted

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
            beaten = refs.beaten(samples, record.role, planned) if more else None
            if beaten:
                raise Pruned(samples, beaten)

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
                models=ctx.launch.model_files(config),
            ),
            requests=Requests(
                ctx.workload,
                ctx.settings,
                config.temperature,
                levels=ctx.spec.load_levels,
                speculative=config.speculative,
                after_request=self._after_request(record, refs, hooks),
                remembers=config.remembers_requests,
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
            unpinned=served.unpinned,
            reference_busy=refs.reference_busy,
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
            return self.model_scores.perplexity_ratio(config), {}
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


def _host_flags(record: TrialRecord) -> str:
    """What the host did to a measured trial: busy, a launch set aside on a busy host, threads not pinned."""
    host, flag = record.host or {}, ""
    if host and host_was_busy(host):
        flag += f" ({busy_text(host['busy_processes'])})"
    if host.get("busy_readings"):
        first = host["busy_readings"][0]
        flag += f" (its first launch, {first['tokens_per_second']:.1f} t/s with {first['busy']}, set aside)"
    if host.get("unpinned"):
        flag += f" (not pinned as asked: {host['unpinned']})"
    return flag


def _set_aside(samples: list[Sample], busy: dict[str, float], ctx: StudyContext) -> dict:
    """A launch set aside because its host was busy, as ``host["busy_readings"]`` keeps it."""
    return {"tokens_per_second": summarize(samples, ctx.settings).tokens_per_second, "busy": busy_text(busy)}


def _kept_aside(record: TrialRecord, busy: list[dict]) -> TrialRecord:
    return replace(record, host={**(record.host or {}), "busy_readings": busy}) if busy else record


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
        host=trial_host_state(ctx.launch.topology, pruned.busy),
    )


def describe_trial(record: TrialRecord) -> str:
    knobs = " ".join(f"{k}={v}" for k, v in record.config.as_dict().items())
    if record.state == "PRUNED":
        assert record.metrics is not None  # a pruned record has the figures measured before it stopped
        return f"PRUNED at {record.metrics.tokens_per_second:.1f} t/s{_host_flags(record)} ({record.pruned}) | {knobs}"
    if record.complete:
        metrics = record.metrics
        assert metrics is not None  # complete means measured
        flag = (" (noisy)" if record.spread and record.spread.noisy else "") + _host_flags(record)
        against = ""
        if record.host and record.host.get("reference_busy"):
            against = f" (against a baseline read on a busy host, {record.host['reference_busy']})"
        return (
            f"{metrics.tokens_per_second:.1f} t/s{flag}, x{metrics.speedup:.2f}{against}, "
            f"acceptance {metrics.acceptance:.2f}, quality {metrics.quality:.3f} | {knobs}"
        )
    failure = record.failure or Failure("error", "")
    return f"FAILED ({failure.reason}: {failure.detail}) | {knobs}"
