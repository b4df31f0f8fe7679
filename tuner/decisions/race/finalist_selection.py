"""Who enters a race: the leader on drift-corrected rates and every trial within reach of it, one per
configuration, and the order that chooses among equals (fewer threads, then the smaller draft model)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import replace

from tuner.decisions import evidence
from tuner.decisions.drift import Sentinels
from tuner.measurement.measure import prompt_rate
from tuner.storage.records import StudyRecord, TrialRecord

MIN_REACH_Z = 2.0  # the fewest spreads from the leader a finalist may be (``reach_z``)


def label(record: TrialRecord) -> str:
    return f"trial-{record.number}"


def reach_z(trials: int) -> float:
    """How many spreads from the leader a trial may be and still be a finalist: the leader is the highest of
    ``trials`` single measurements, so the true best must be in reach of each of the others at once: z at 5% over
    them (Bonferroni), at least ``MIN_REACH_Z``: a fixed
    z would leave the true best out more often the more trials a study has."""
    return max(MIN_REACH_Z, statistics.NormalDist().inv_cdf(1 - evidence.ALPHA / max(trials - 1, 1)))


def within_reach(
    scored: Sequence[tuple[float, float] | tuple[float, float, int]], launch: float
) -> list[int]:
    """Indexes of (log rate, cv[, readings]) entries within reach of the best, closest first.

    An entry is a configuration's recorded readings: the mean log rate of its ``readings`` launches (1 when not
    given) and their within-launch cv. Its mean varies by ``(cv^2 + launch^2) / readings``, so the gap to the best
    is within reach below ``reach_z(n) * sqrt(var_best + var)``: ``sqrt(cv_best^2 + cv^2 + 2 launch^2)`` where each
    was measured in one launch of its own, narrower where the study measured a configuration again. Why: a
    finalist whose readings lie below the leader's by more than the launch spread explains is not the best (at
    the cut's level), and a race launch spent on it is one its bound does not need."""
    if not scored:
        return []
    entries = [(entry[0], entry[1], entry[2] if len(entry) > 2 else 1) for entry in scored]
    order = sorted(range(len(entries)), key=lambda i: entries[i][0], reverse=True)
    top = entries[order[0]]
    reach = reach_z(len(entries))

    def variance(entry: tuple[float, float, int]) -> float:
        return (entry[1] ** 2 + launch**2) / max(entry[2], 1)

    return [
        i for i in order if top[0] - entries[i][0] <= reach * math.sqrt(variance(top) + variance(entries[i]))
    ]


def recorded_rate(record: TrialRecord, users: int | None = None) -> float:
    """What a trial recorded: one user's tokens/s, or with ``users`` the aggregate tokens/s at that level (0.0
    when it measured none)."""
    if users is None:
        return record.metrics.tokens_per_second if record.metrics else 0.0
    return record.level_figure("aggregate_tokens_per_second", users) or 0.0


def finalists(
    records: list[TrialRecord], noise_cv: float, max_finalists: int, users: int | None = None
) -> list[TrialRecord]:
    """The leader on drift-corrected rates and the feasible trials within reach of it, closest first,
    one per configuration (raw rates when a trial has no sentinel to divide by): a configuration measured in
    several trials is judged on its readings together (``within_reach``), its best trial standing for it.

    With ``users``, a load class's finalists: on the aggregate tokens/s at that level, over the same sentinel
    rate (drift moves every level of a trial alike), each with the study's noise_cv (a level is one pass)."""
    sentinels = Sentinels(records, noise_cv)
    pool = [
        r
        for r in records
        if r.feasible and r.role != "sentinel" and recorded_rate(r) > 0 and recorded_rate(r, users) > 0
    ]
    corrected = [1.0 if r.role == "baseline" else sentinels.speedup(r) for r in pool]
    known = [speedup for speedup in corrected if speedup]
    rates = known if len(known) == len(corrected) else [recorded_rate(r) for r in pool]
    logs = [
        (
            math.log(rate * recorded_rate(r, users) / recorded_rate(r)),
            r.spread.cv if users is None and r.spread and r.spread.cv is not None else noise_cv,
            r,
        )
        for rate, r in zip(rates, pool)
    ]
    readings: dict = {}  # per configuration, its recorded readings (log rate, cv, its trial), the best first
    for reading in sorted(logs, key=lambda entry: -entry[0]):
        readings.setdefault(reading[2].config, []).append(reading)
    configurations = list(readings.values())
    scored = [
        (
            statistics.fmean(log for log, _, _ in group),
            math.sqrt(statistics.fmean(cv * cv for _, cv, _ in group)),
            len(group),
        )
        for group in configurations
    ]
    chosen: dict = {}  # within reach of the leader, configurations that differ at most in prompt threads: one
    for index in within_reach(scored, sentinels.launch_spread()):  # finalist, the better prompt throughput
        best_trial = configurations[index][0][2]  # a configuration measured again: its best reading's trial
        chosen.setdefault(replace(best_trial.config, threads_batch=None), []).append(best_trial)
    return [prompt_pick(group) for group in chosen.values()][:max_finalists]


def prompt_pick(siblings: list[TrialRecord]) -> TrialRecord:
    """Of trials within reach of the leader whose configurations differ at most in ``threads_batch`` (the first:
    the closest to the leader), the one with the best prompt throughput, ties (``evidence.THREAD_TIE``) to fewer
    prompt threads: their decode is level within the noise, and prompt threads are tuned on prompts
    (``tuner.search.stages.prompt_threads``). The first where fewer than two measured prompts, or all share one
    prompt thread count."""
    rated = [(rate, r) for r in siblings if (rate := prompt_rate(r.samples))]
    if len({r.config.threads_batch for _, r in rated}) < 2:
        return siblings[0]
    top = max(rate for rate, _ in rated)
    tied = [r for rate, r in rated if rate >= (1 - evidence.THREAD_TIE) * top]
    return min(tied, key=lambda r: r.config.threads_batch or r.config.threads)


def resource_key(record: TrialRecord, study: StudyRecord) -> tuple:
    """What a finalist costs, smaller first: its threads, then its draft model's bytes (none is smallest)."""
    config = record.config
    draft_bytes = (
        (study.drafts.get(config.draft) or {}).get("file_size_bytes", 0)
        if config.speculative and config.draft
        else 0
    )
    return (config.threads, draft_bytes)
