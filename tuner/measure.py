"""Measure a running server on a workload, and reduce the samples to a trial's scores.

Speed is llama.cpp's own decode timing (``predicted_n`` / ``predicted_ms``), never wall
clock: wall clock would add HTTP, JSON and prompt processing to a figure meant to
compare decode configurations. Each repetition is one pass over all prompts; the
spread across repetitions says whether the figure can be trusted.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from tuner.failures import FailureReason, TrialFailure
from tuner.runner import LlamaServer
from tuner.workload import Workload


@dataclass(frozen=True)
class MeasurementSettings:
    """How every trial of a study is measured (the study file's ``measurement`` section)."""

    warmup: int = 1  # requests of the first prompt, discarded
    repetitions: int = 3  # passes over all prompts
    n_predict: int = 128
    ctx_size: int = 2048
    seed: int = 42  # the same seed every request: repetitions differ in timing only
    noise_cv: float = 0.10  # above this coefficient of variation a trial is flagged noisy
    trial_timeout_s: float = 600.0

    def comparability(self) -> dict:
        """What changes the numbers: everything but the timeout."""
        return {k: v for k, v in asdict(self).items() if k != "trial_timeout_s"}


@dataclass(frozen=True)
class Sample:
    """One measured request."""

    prompt_id: str
    suite: str
    repetition: int
    predicted_n: int
    predicted_ms: float
    tokens_per_second: float
    draft_n: int
    draft_n_accepted: int
    text: str
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Scores:
    tokens_per_second: float  # median over repetitions of each repetition's pooled rate
    cv: float | None  # coefficient of variation of the per-repetition rates (None with one: unknown)
    noisy: bool | None  # cv above settings.noise_cv; None when the spread is unknown
    repetitions: int
    per_suite_tokens_per_second: dict[str, float]
    drafted: int
    accepted: int
    acceptance: float  # accepted / drafted, 0.0 when nothing was drafted
    n_samples: int


def run_workload(
    server: LlamaServer,
    workload: Workload,
    settings: MeasurementSettings,
    temperature: float,
    progress: Callable[[int, int], None] | None = None,
) -> list[Sample]:
    """Warm up, then ``repetitions`` passes over every prompt; ``progress(done, total)`` after each.

    Warm-up sends ``settings.warmup`` requests of the first prompt and discards them:
    the first request pays for page faults in the mapped weights and buffer
    allocation, which every prompt shares, so one prompt is enough.
    """
    first = workload.prompts[0]
    for _ in range(settings.warmup):
        server.complete(first.text, settings.n_predict, temperature, settings.seed)
    total = settings.repetitions * len(workload.prompts)
    samples = []
    for repetition in range(settings.repetitions):
        for prompt in workload.prompts:
            c = server.complete(prompt.text, settings.n_predict, temperature, settings.seed)
            samples.append(
                Sample(
                    prompt_id=prompt.id,
                    suite=prompt.suite,
                    repetition=repetition,
                    predicted_n=c.predicted_n,
                    predicted_ms=c.predicted_ms,
                    tokens_per_second=c.predicted_per_second,
                    draft_n=c.draft_n,
                    draft_n_accepted=c.draft_n_accepted,
                    text=c.text,
                    tokens=c.tokens,
                )
            )
            if progress:
                progress(len(samples), total)
    return samples


def pooled_rate(samples: Iterable[Sample]) -> float:
    """Tokens per second of a group of requests: total tokens over total decode time.

    Pooling weights each request by its length, so a prompt that stopped early at
    end-of-sequence does not count as much as one that generated ``n_predict`` tokens.
    """
    samples = list(samples)
    ms = sum(s.predicted_ms for s in samples)
    return 1000.0 * sum(s.predicted_n for s in samples) / ms if ms > 0 else 0.0


def _median_over_repetitions(samples: list[Sample]) -> tuple[float, list[float]]:
    repetitions = sorted({s.repetition for s in samples})
    rates = [pooled_rate(s for s in samples if s.repetition == r) for r in repetitions]
    return statistics.median(rates), rates


def summarize(samples: list[Sample], settings: MeasurementSettings) -> Scores:
    """A trial's scores from its measured samples."""
    if not samples:
        raise ValueError("summarize needs at least one sample")
    median, rates = _median_over_repetitions(samples)
    mean = statistics.fmean(rates)
    cv = (statistics.stdev(rates) / mean if mean > 0 else 0.0) if len(rates) > 1 else None
    suites = dict.fromkeys(s.suite for s in samples)
    drafted = sum(s.draft_n for s in samples)
    accepted = sum(s.draft_n_accepted for s in samples)
    return Scores(
        tokens_per_second=median,
        cv=cv,
        noisy=cv > settings.noise_cv if cv is not None else None,
        repetitions=len(rates),
        per_suite_tokens_per_second={
            suite: _median_over_repetitions([s for s in samples if s.suite == suite])[0] for suite in suites
        },
        drafted=drafted,
        accepted=accepted,
        acceptance=accepted / drafted if drafted else 0.0,
        n_samples=len(samples),
    )


def outputs_by_prompt(samples: list[Sample]) -> dict[str, Sample]:
    """Each prompt's sample from the first measured repetition (for quality scoring)."""
    first = min(s.repetition for s in samples)
    return {s.prompt_id: s for s in samples if s.repetition == first}


def score_trial(samples: list[Sample], settings: MeasurementSettings, speculative: bool, spec_type: str,
                spec_problem: str | None, log_tail: str) -> Scores:
    """The trial's scores; a trial that asked for speculation and drafted nothing is a failure
    (llama.cpp serves without a draft it cannot use), never a fast result. One rule for
    studies and recorded grids."""
    scores = summarize(samples, settings)
    if speculative and scores.drafted == 0:
        raise TrialFailure(FailureReason.SPECULATION_UNAVAILABLE,
                           f"asked for {spec_type} but llama.cpp drafted nothing"
                           + (f": {spec_problem}" if spec_problem else ""), log_tail)
    return scores
