"""What a trial is judged against, read from its study before it measures: the quality reference, the
speed reference now (the sentinels interpolated), the incumbent a prunable trial must be able to beat and the
rule that stops it, a permanent failure of the same configuration, and the text scorers' figures, measured
once per model against the baseline's (``ModelScores``). Why a module of its own: what the study already
knows changes for other reasons than how one launch is measured (``run/trial_measurement``).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field, replace

import optuna

from tuner.decisions.drift import Sentinels, midpoint
from tuner.knobs.config import TrialConfig
from tuner.measurement import quality as quality_scorers
from tuner.measurement.failures import PERMANENT, FailureReason, TrialFailure
from tuner.measurement.launch import model_flags
from tuner.measurement.measure import Sample
from tuner.measurement.quality import ScorerFigures
from tuner.prepare import StudyContext
from tuner.search.pruning import may_prune, prunes_on, should_prune
from tuner.search.space import baseline_config
from tuner.storage import store
from tuner.storage.coordination import worker_id
from tuner.storage.records import Reference, TrialRecord, digest


@dataclass(frozen=True)
class References:
    """What a trial is compared with, read before it measures (from then on storage is written only
    after the journal): the quality reference, the speed reference now, and the incumbent to prune on."""

    reference: Reference | None
    reference_rate: float | None  # None for a baseline or sentinel: it is its own reference
    incumbent: TrialRecord | None = None  # None: not pruned
    against: list[dict] = field(default_factory=list)  # the incumbent's samples, drift-corrected
    launch_sigma: float = 0.0  # the spread this host's sentinels show between launches
    reference_busy: str = ""  # ``host busy: ...`` while every reference of this worker ran on a busy host

    def beaten(self, samples: list[Sample], role: str, planned: int) -> str | None:
        """Why the trial so far cannot beat the incumbent (None: it goes on, or there is none to prune on)."""
        if self.incumbent is None:
            return None
        decision = should_prune(
            [sample_record(s) for s in samples], self.against, role, planned, launch_sigma=self.launch_sigma
        )
        return f"against trial {self.incumbent.number}: {decision.reason}" if decision.prune else None


def read_references(ctx: StudyContext, study: optuna.Study, record: TrialRecord) -> References:
    """The quality reference, this worker's speed reference now (the sentinels interpolated), and
    the incumbent a prunable trial must be able to beat."""
    own = record.role in ("baseline", "sentinel")
    reference = None if record.role == "baseline" else store.read_reference(study)
    records = store.read_trials(study)
    sentinels = Sentinels(records, ctx.settings.noise_cv)
    rate, busy = None, ""
    if not own:
        rate = sentinels.rate_at(worker_id(), time.time()) or (
            reference.tokens_per_second if reference else None
        )
        busy = sentinels.busy_reference(worker_id())
    objectives = [o.metric for o in ctx.spec.objectives]
    if not (ctx.spec.prune and may_prune(record.role, record.search.get("stage")) and prunes_on(objectives)):
        return References(reference, rate, reference_busy=busy)
    incumbent = store.best_of(records)
    if incumbent is None:
        return References(reference, rate, reference_busy=busy)
    # the incumbent ran in another launch: allow the spread this host's sentinels show between launches
    return References(
        reference,
        rate,
        incumbent,
        drift_corrected(incumbent, sentinels),
        sentinels.launch_spread(worker_id()),
        busy,
    )


def refuse_known_failure(study: optuna.Study, config: TrialConfig) -> None:
    """A configuration that failed for a reason that will not change is not relaunched."""
    permanent = {r.value for r in PERMANENT}
    for past in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)):
        known = store.read_trial(past)
        if known.config == config and known.failure and known.failure.reason in permanent:
            raise TrialFailure(
                FailureReason(known.failure.reason),
                f"same configuration already failed permanently in trial {known.number}",
                known.log_tail,
            )


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

    def perplexity_ratio(self, config: TrialConfig) -> float:
        """The baseline's perplexity over this configuration's, the baseline's measured first."""
        return quality_scorers.perplexity_ratio(
            self.perplexity(baseline_config(self.ctx.space)), self.perplexity(config)
        )
