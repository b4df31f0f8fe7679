"""Measure a running server on a workload, and reduce the samples to a trial's scores.

Speed is llama.cpp's own decode timing (``predicted_n`` / ``predicted_ms``), never wall
clock: wall clock would add HTTP, JSON and prompt processing to a figure meant to
compare decode configurations. Each repetition is one pass over all prompts; the
spread across repetitions says whether the figure can be trusted.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace

from tuner.measurement.failures import FailureReason, TrialFailure
from tuner.measurement.server_process import Completion, LlamaServer
from tuner.measurement.workload import Prompt, Workload, request_key

TIMING_FLOOR_MS = 200.0  # requests shorter than this are not judged against the wall clock
# ... and this much of a request's wall time may be a stall of the host, not a lie: a busy host holds a short
# request several times its decode time (evidence: docs/decisions.md#host-stalls)
TIMING_SLACK_MS = 250.0


@dataclass(frozen=True)
class MeasurementSettings:
    """How every trial of a study is measured (the study file's ``measurement`` section)."""

    warmup: int = 1  # requests of the first prompt, discarded
    repetitions: int = 3  # passes over all prompts, at least
    max_repetitions: int | None = None  # more passes while the cv is above noise_cv, up to this
    n_predict: int = 128
    ctx_size: int = 2048
    seed: int = 42  # the same seed every request: repetitions differ in timing only
    noise_cv: float = 0.10  # above this coefficient of variation a trial is flagged noisy
    trial_timeout_s: float = 600.0
    timing_factor: float = 3.0  # llama.cpp's decode time and the wall clock may differ by at most this
    concurrency: tuple[int, ...] = (
        1,
    )  # users served at once (tuner.measurement.load); the study record keeps it

    def comparability(self) -> dict:
        """What changes the numbers: everything but the timeout (and the concurrency levels, which the
        study record keeps with the workload, so a study of one user stores what it always stored)."""
        return {k: v for k, v in asdict(self).items() if k not in ("trial_timeout_s", "concurrency")}


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
    wall_ms: float = 0.0  # the request's wall time (0: not measured)
    # per speculative implementation (llama.cpp's type name): (type, drafted, accepted) in this request
    sources: tuple[tuple[str, int, int], ...] = ()
    turn: int = 0  # a conversation's turn (1, 2, ...); 0 for a raw prompt
    prompt_ms: float = 0.0  # llama.cpp's prompt processing time: the server's part of time to first token
    cached_n: int = 0  # prompt tokens taken from the server's prompt cache
    prompt_n: int = (
        0  # prompt tokens the server processed (not from its cache): prompt throughput's numerator
    )

    @property
    def key(self) -> str:
        """This request among the trial's: the prompt id, with its turn from the second on."""
        return request_key(self.prompt_id, self.turn)


@dataclass(frozen=True)
class Scores:
    tokens_per_second: float  # median over repetitions of each repetition's pooled rate
    cv: float | None  # coefficient of variation of the per-repetition rates (None with one: unknown)
    noisy: bool | None  # cv above settings.noise_cv; None when the spread is unknown
    repetitions: int
    per_suite_tokens_per_second: dict[str, float]
    per_turn_tokens_per_second: dict[int, float]  # conversations only: turn -> median over repetitions
    drafted: int
    accepted: int
    acceptance: float  # accepted / drafted, 0.0 when nothing was drafted
    n_samples: int


def run_workload(
    server: LlamaServer,
    workload: Workload,
    settings: MeasurementSettings,
    temperature: float,
    after_request: Callable[[list[Sample], bool, bool], None] | None = None,
    speculative: bool = False,
    unseen_warmup: bool = False,
) -> list[Sample]:
    """Warm up, then passes over every prompt: ``repetitions`` of them, and more (up to
    ``max_repetitions``) while the per-pass rates spread more than ``noise_cv``.

    Warm-up replays ``warmup_entries`` ``settings.warmup`` times, each request generating the full
    ``n_predict``, and discards them: the first request pays for page faults in the mapped weights and
    buffer allocation, which every prompt shares; a conversation's replay also brings a stateful lookup
    (ngram-cache) to its steady state, the same for every configuration. A conversation is measured
    turn by turn, each turn one request and one sample. ``after_request(samples so far, pass_done,
    more)`` runs after every request: ``pass_done`` when it ended a pass (a running rate to report),
    ``more`` when another request follows (a pruner acts only then: after the last one there is nothing
    left to save). With ``speculative`` each sample carries what each speculative source drafted. With
    ``unseen_warmup`` the warm-up serves text no pass measures (``unseen``): a lookup that remembers requests
    would otherwise draft the first prompt's answer from memory.
    """
    warm_requests = warm_up(server, workload, settings, temperature, unseen_warmup)
    cap = max(settings.repetitions, settings.max_repetitions or settings.repetitions)
    per_pass = workload.requests_per_pass
    samples: list[Sample] = []
    for repetition in range(cap):
        if repetition and not another_pass(samples, repetition, cap, settings):
            break
        done_in_pass = 0
        for prompt in workload.prompts:
            for turn, completion in enumerate(_requests(server, prompt, settings, temperature), start=1):
                samples.append(_sample(prompt, repetition, check_timing(completion, settings), turn))
                done_in_pass += 1
                if after_request:
                    pass_done = done_in_pass == per_pass
                    after_request(
                        samples,
                        pass_done,
                        not pass_done or another_pass(samples, repetition + 1, cap, settings),
                    )
    return with_sources(samples, server.source_totals(warm_requests + len(samples)) if speculative else [])


def warm_up(
    server: LlamaServer,
    workload: Workload,
    settings: MeasurementSettings,
    temperature: float,
    unseen_warmup: bool = False,
) -> int:
    """``settings.warmup`` replays of ``warmup_entries`` (each ``unseen`` with ``unseen_warmup``), discarded;
    the requests they took."""
    warm = [unseen(p) for p in warmup_entries(workload)] if unseen_warmup else warmup_entries(workload)
    for _ in range(settings.warmup):
        for entry in warm:
            for completion in _requests(server, entry, settings, temperature):
                check_timing(completion, settings)
    return settings.warmup * sum(p.n_turns for p in warm)


def warmup_entries(workload: Workload) -> list[Prompt]:
    """The first prompt, and the first conversation of every suite that holds conversations."""
    entries = [workload.prompts[0]]
    for suite in workload.suites:
        first = next((p for p in workload.prompts if p.suite == suite and p.chat), None)
        if first is not None and first not in entries:
            entries.append(first)
    return entries


def unseen(prompt: Prompt) -> Prompt:
    """The entry with the words of every message in reverse order: as long, from the same vocabulary, and
    touching the same weights, but neither it nor the answer it gets is one a pass measures."""

    def reverse(text: str) -> str:
        return " ".join(reversed(text.split()))

    return replace(
        prompt,
        id=f"{prompt.id}~unseen",
        text=reverse(prompt.text),
        messages=tuple((role, reverse(content)) for role, content in prompt.messages),
        turns=tuple(reverse(turn) for turn in prompt.turns),
    )


def _requests(server: LlamaServer, prompt: Prompt, settings: MeasurementSettings, temperature: float):
    """One entry's requests, lazily: a raw prompt's one, or a conversation's turns, each carrying the
    earlier turns and the replies this server gave (as llama.cpp's speed_bench does)."""
    if not prompt.chat:
        yield server.complete(prompt.text, settings.n_predict, temperature, settings.seed)
        return
    replies: list[str] = []
    for _ in range(prompt.n_turns):
        completion = server.chat(prompt.conversation(replies), settings.n_predict, temperature, settings.seed)
        replies.append(completion.text)
        yield completion


def _sample(prompt: Prompt, repetition: int, completion: Completion, turn: int) -> Sample:
    return Sample(
        prompt_id=prompt.id,
        suite=prompt.suite,
        repetition=repetition,
        predicted_n=completion.predicted_n,
        predicted_ms=completion.predicted_ms,
        tokens_per_second=completion.predicted_per_second,
        draft_n=completion.draft_n,
        draft_n_accepted=completion.draft_n_accepted,
        wall_ms=completion.wall_ms,
        text=completion.text,
        tokens=completion.tokens,
        turn=turn if prompt.chat else 0,
        prompt_ms=completion.prompt_ms,
        cached_n=completion.cached_n,
        prompt_n=completion.prompt_n,
    )


def with_sources(samples: list[Sample], totals: list[dict[str, tuple[int, int]]]) -> list[Sample]:
    """Each request's drafted and accepted tokens per source, from the server's running totals
    (one block per finished request, warm-up first); unchanged when the totals do not line up."""
    if not samples or len(totals) < len(samples):
        return samples
    totals = totals[len(totals) - len(samples) - 1 :] if len(totals) > len(samples) else [{}, *totals]
    out = []
    for sample, before, after in zip(samples, totals, totals[1:]):
        sources = tuple(
            (name, d - before.get(name, (0, 0))[0], a - before.get(name, (0, 0))[1])
            for name, (d, a) in after.items()
        )
        out.append(replace(sample, sources=sources))
    return out


def per_source(samples: Iterable[Sample | dict]) -> dict[str, tuple[int, int]]:
    """Drafted and accepted tokens per speculative source over a group of requests (samples or their records)."""
    totals: dict[str, tuple[int, int]] = {}
    for sample in samples:
        for name, drafted, accepted in (
            sample.get("sources") or () if isinstance(sample, dict) else sample.sources
        ):
            drafted_so_far, accepted_so_far = totals.get(name, (0, 0))
            totals[name] = (drafted_so_far + drafted, accepted_so_far + accepted)
    return totals


def another_pass(samples: list[Sample], passes_done: int, cap: int, settings: MeasurementSettings) -> bool:
    """Whether ``run_workload`` starts another pass after ``passes_done`` (the one rule its loop follows)."""
    return passes_done < cap and (passes_done < settings.repetitions or _too_noisy(samples, settings))


def _too_noisy(samples: list[Sample], settings: MeasurementSettings) -> bool:
    _, rates = median_over_repetitions(samples)
    return len(rates) < 2 or statistics.stdev(rates) / statistics.fmean(rates) > settings.noise_cv


def check_timing(completion: Completion, settings: MeasurementSettings) -> Completion:
    """llama.cpp's decode time must fit in the request's wall time, and not be a small part of it.

    A decode rate that disagrees with the wall clock by more than ``timing_factor`` (after
    taking out the prompt's own time, a little HTTP overhead and ``TIMING_SLACK_MS`` of host stall)
    is not a measurement.
    """
    decode_wall_ms = completion.wall_ms - completion.prompt_ms
    if completion.wall_ms <= 0 or decode_wall_ms < TIMING_FLOOR_MS:
        return completion  # too short to judge (or no wall time: a replay)
    if (
        completion.predicted_ms > completion.wall_ms * 1.05 + TIMING_FLOOR_MS
        or completion.predicted_ms * settings.timing_factor + TIMING_SLACK_MS < decode_wall_ms
    ):
        raise TrialFailure(
            FailureReason.IMPOSSIBLE_TIMING,
            f"llama.cpp says {completion.predicted_n} tokens decoded in {completion.predicted_ms:.0f} ms, but the request took "
            f"{completion.wall_ms:.0f} ms ({completion.prompt_ms:.0f} ms of it prompt): more than x{settings.timing_factor:g} apart",
        )
    return completion


def pooled_rate(samples: Iterable[Sample | dict]) -> float:
    """Tokens per second of a group of requests: total tokens over total decode time.

    Pooling weights each request by its length, so a prompt that stopped early at
    end-of-sequence does not count as much as one that generated ``n_predict`` tokens.
    """
    samples = list(samples)
    ms = sum(_field(s, "predicted_ms") for s in samples)
    return 1000.0 * sum(_field(s, "predicted_n") for s in samples) / ms if ms > 0 else 0.0


def _field(sample: Sample | dict, name: str):
    """A sample's field, measured (``Sample``) or stored (its dict in a TrialRecord)."""
    return sample.get(name, 0) if isinstance(sample, dict) else getattr(sample, name)


def prompt_rate(samples: Iterable[dict]) -> float | None:
    """Prompt tokens processed per second over a trial's requests (llama.cpp's prompt timings, pooled); None
    where no request processed a prompt it had not cached (or the samples predate the field)."""
    timed = [(s.get("prompt_n", 0), s.get("prompt_ms", 0.0)) for s in samples]
    tokens, ms = sum(n for n, t in timed if n > 0 and t > 0), sum(t for n, t in timed if n > 0 and t > 0)
    return 1000.0 * tokens / ms if ms > 0 else None


def pooled_from_rates(samples: Iterable[dict]) -> float:
    """``pooled_rate`` of stored requests known only by their tokens/s (a simulated replay stores no
    lengths): equal tokens per request, so total tokens over total time is the harmonic mean."""
    inverse = [1.0 / s["tokens_per_second"] for s in samples if s.get("tokens_per_second")]
    return len(inverse) / sum(inverse) if inverse else 0.0


def median_over_repetitions(
    samples: list[Sample] | list[dict], pool: Callable[[Iterable], float] | None = None
) -> tuple[float, list[float]]:
    """The median over repetitions of each repetition's pooled rate, and those rates: a trial's figure, from
    its measured samples or its stored ones (``pool``: ``pooled_from_rates`` for stored requests without
    lengths, a simulated replay's)."""
    pool = pool or pooled_rate
    repetitions = sorted({_field(s, "repetition") for s in samples})
    rates = [pool(s for s in samples if _field(s, "repetition") == r) for r in repetitions]
    return statistics.median(rates), rates


def repetition_cv(rates: list[float]) -> float | None:
    """How far a trial's per-repetition rates disagree (their coefficient of variation); None with one."""
    if len(rates) < 2:
        return None
    mean = statistics.fmean(rates)
    return statistics.stdev(rates) / mean if mean > 0 else 0.0


def summarize(samples: list[Sample], settings: MeasurementSettings) -> Scores:
    """A trial's scores from its measured samples."""
    if not samples:
        raise ValueError("summarize needs at least one sample")
    median, rates = median_over_repetitions(samples)
    cv = repetition_cv(rates)
    suites = dict.fromkeys(s.suite for s in samples)
    drafted = sum(s.draft_n for s in samples)
    accepted = sum(s.draft_n_accepted for s in samples)
    return Scores(
        tokens_per_second=median,
        cv=cv,
        noisy=cv > settings.noise_cv if cv is not None else None,
        repetitions=len(rates),
        per_suite_tokens_per_second={
            suite: median_over_repetitions([s for s in samples if s.suite == suite])[0] for suite in suites
        },
        per_turn_tokens_per_second={
            turn: median_over_repetitions([s for s in samples if s.turn == turn])[0]
            for turn in sorted({s.turn for s in samples if s.turn})
        },
        drafted=drafted,
        accepted=accepted,
        acceptance=accepted / drafted if drafted else 0.0,
        n_samples=len(samples),
    )


def outputs_by_prompt(samples: list[Sample]) -> dict[str, Sample]:
    """Each request's sample from the first measured repetition, by request key (for quality scoring)."""
    first = min(s.repetition for s in samples)
    return {s.key: s for s in samples if s.repetition == first}


def score_trial(
    samples: list[Sample],
    settings: MeasurementSettings,
    speculative: bool,
    spec_type: str,
    spec_problem: str | None,
    log_tail: str,
) -> Scores:
    """The trial's scores, failed by ``check_drafted``."""
    scores = summarize(samples, settings)
    check_drafted(spec_type if speculative else "", scores.drafted, spec_problem, log_tail)
    return scores


def check_drafted(spec_type: str, drafted: int, spec_problem: str | None, log_tail: str) -> None:
    """A launch that asked for speculation (``spec_type``, "" for none) and drafted nothing is a failure
    (llama.cpp serves without a draft it cannot use), never a fast result. One rule for studies, recorded
    grids and re-measures."""
    if spec_type and drafted == 0:
        raise TrialFailure(
            FailureReason.SPECULATION_UNAVAILABLE,
            f"asked for {spec_type} but llama.cpp drafted nothing"
            + (f": {spec_problem}" if spec_problem else ""),
            log_tail,
        )
