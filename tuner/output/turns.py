"""Conversations turn by turn: how each configuration family does on turn 1, 2, 3 of the chat suites.

Why: a later turn carries the earlier turns and replies, so prompt lookup finds more to copy there and
the winner of a single-turn study can lose on turn 3 (or the reverse). The figures are per trial: one
launch each, the request-level median over repetitions of a turn's pooled rate; the race, not this
table, says what holds across launches.
"""

from __future__ import annotations

import statistics

import pandas as pd

from tuner.measurement.measure import median_over_repetitions
from tuner.storage.records import TrialRecord

TURN_COLUMNS = [
    "family",
    "trial",
    "method",
    "turn",
    "tokens_per_second",
    "baseline_tokens_per_second",
    "speedup",
    "acceptance",
    "prompt_ms",
    "cached_tokens",
]


def turn_table(records: list[TrialRecord]) -> pd.DataFrame:
    """One row per (complete trial, turn) of its conversation requests: the median over repetitions
    of the turn's pooled decode rate, its acceptance, the median prompt time and cached prompt tokens."""
    rows = []
    for record in records:
        if not record.complete:
            continue
        by_turn: dict[int, list[dict]] = {}
        for sample in record.samples:
            if sample.get("turn"):
                by_turn.setdefault(int(sample["turn"]), []).append(sample)
        for turn, samples in sorted(by_turn.items()):
            drafted = sum(s.get("draft_n", 0) for s in samples)
            rows.append(
                {
                    "trial": record.number,
                    "role": record.role,
                    "family": record.config.family,
                    "turn": turn,
                    "tokens_per_second": median_over_repetitions(samples)[0],
                    "acceptance": sum(s.get("draft_n_accepted", 0) for s in samples) / drafted
                    if drafted
                    else None,
                    "prompt_ms": statistics.median(s.get("prompt_ms", 0.0) for s in samples),
                    "cached_tokens": statistics.median(s.get("cached_n", 0) for s in samples),
                }
            )
    return pd.DataFrame(rows, columns=["trial", "role", "family", "turn", *TURN_COLUMNS[4:]])


def speedup_by_turn(records: list[TrialRecord], frame: pd.DataFrame) -> pd.DataFrame:
    """For each family (draft, lookup, stack) its fastest feasible trial overall, turn by turn, against
    the baseline's rate on the same turn (the median over the baseline and its sentinels)."""
    turns = turn_table(records)
    if turns.empty:
        return pd.DataFrame(columns=TURN_COLUMNS)
    base = turns[turns["role"].isin(["baseline", "sentinel"])].groupby("turn")["tokens_per_second"].median()
    pool = frame[frame["feasible"].astype(bool)]
    rows = []
    for family in ("draft", "lookup", "stack"):
        candidates = pool[pool["family"] == family]
        if candidates.empty:
            continue
        best = candidates.loc[candidates["tokens_per_second"].idxmax()]
        for _, row in turns[turns["trial"] == best["trial"]].iterrows():
            reference = base.get(row["turn"])
            rows.append(
                {
                    **{k: row[k] for k in ("family", "trial", "turn", "tokens_per_second")},
                    "method": best["method"],
                    "baseline_tokens_per_second": reference,
                    "speedup": row["tokens_per_second"] / reference if reference else None,
                    "acceptance": row["acceptance"],
                    "prompt_ms": row["prompt_ms"],
                    "cached_tokens": row["cached_tokens"],
                }
            )
    return pd.DataFrame(rows, columns=TURN_COLUMNS)
