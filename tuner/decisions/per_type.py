"""Per-content-type winners, picked on tuning prompts and checked on held-out prompts.

Why: the best draft length depends on content (code drafts well at long K, prose does
not), so one pooled winner leaves speed on the table for a server that sees both. But a
type's best trial is picked on few prompts and is biased upwards, like any maximum.

The rule:

1. Each suite's prompts are split (``tuner.measurement.workload.split``: the last ``max(2, n // 3)``
   prompts of a suite are held out; a suite with fewer than 3 prompts has no split).
2. A type's winner is the feasible trial (not a sentinel) with the highest tokens/s on the
   type's *tuning* prompts, from the trial's recorded samples (pooled rate per repetition,
   median over repetitions; ties go to the earlier trial).
3. The type winners, the pooled winner (the finalist race's) and the baseline are re-measured
   on the *held-out* prompts, each round launching each of them once
   (``tuner.decisions.remeasure.rounds_of_launches``), one pooled rate per suite and launch.
4. A type's gain is the geometric mean of its winner's per-round ratios over the pooled winner
   on that type's held-out prompts, with a 95% t-interval over rounds (``tuner.decisions.evidence``).
   The type gets its own served configuration only when there are enough rounds and the whole
   interval lies above 1: a gain inside the launch-to-launch noise gets no separate entry.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict, cast

import optuna

from tuner.decisions import evidence
from tuner.decisions.race import label
from tuner.decisions.remeasure import StudyInputs, contender, rounds_of_launches
from tuner.knobs.config import method_of
from tuner.measurement.workload import HELD_OUT_MIN, Split, restrict, split
from tuner.progress import Progress
from tuner.storage import store
from tuner.storage.records import TrialRecord
from tuner.studyfile.spec import RaceSpec

TYPE_ROUNDS = 4  # held-out rounds at least, whatever the race's rounds (docs/decisions.md#per-type-rounds)


def type_rounds(race: RaceSpec) -> int:
    """The per-type race's rounds: the study's race rounds at least, and ``TYPE_ROUNDS``."""
    return max(race.min_rounds, race.confirm_rounds, TYPE_ROUNDS)


RULE = (
    "a type gets its own entry when its winner beats the pooled winner on the type's held-out prompts with the "
    f"whole 95% t-interval of the gain (paired launches, at least {evidence.MIN_ROUNDS} rounds) above 1"
)


def _pooled(samples: list[dict]) -> float:
    ms = sum(s["predicted_ms"] for s in samples)
    return 1000.0 * sum(s["predicted_n"] for s in samples) / ms if ms > 0 else 0.0


def tuning_rate(record: TrialRecord, prompt_ids: tuple[str, ...] | list[str]) -> float | None:
    """A trial's tokens/s on some of its prompts: pooled per repetition, median over repetitions.
    None when it has no recorded sample of those prompts."""
    keep = set(prompt_ids)
    chosen = [s for s in record.samples if s.get("prompt_id") in keep]
    if not chosen:
        return None
    repetitions = sorted({s.get("repetition", 0) for s in chosen})
    return statistics.median(_pooled([s for s in chosen if s.get("repetition", 0) == r]) for r in repetitions)


def type_winners(
    records: list[TrialRecord], splits: dict[str, Split]
) -> dict[str, tuple[TrialRecord, float]]:
    """For each split suite, the feasible trial fastest on its tuning prompts, with that rate."""
    pool = [r for r in records if r.feasible and r.role != "sentinel"]
    winners: dict[str, tuple[TrialRecord, float]] = {}
    for suite, suite_split in splits.items():
        rated = [(r, rate) for r in pool if (rate := tuning_rate(r, suite_split.tuning)) is not None]
        if rated:
            winners[suite] = max(rated, key=lambda pair: (pair[1], -pair[0].number))
    return winners


@dataclass(frozen=True)
class TypeResult:
    suite: str
    tuning_prompts: list[str]
    held_out_prompts: list[str]
    winner: int  # trial picked on the tuning prompts
    config: dict
    pooled: int  # the pooled winner's trial
    tuning_tokens_per_second: float  # the type winner on the tuning prompts (recorded samples)
    pooled_tuning_tokens_per_second: float | None
    held_out_tokens_per_second: float  # median over rounds on the held-out prompts
    pooled_held_out_tokens_per_second: float
    baseline_held_out_tokens_per_second: float
    held_out_rates: list[float]  # the type winner, one per round
    gain: float  # held-out: the type winner over the pooled winner
    gain_low: float
    gain_high: float
    pays: bool
    why: str


class TypeResultJson(TypedDict):
    """A ``TypeResult`` as JSON (``asdict``): its fields by name."""

    suite: str
    tuning_prompts: list[str]
    held_out_prompts: list[str]
    winner: int
    config: dict[str, Any]
    pooled: int
    tuning_tokens_per_second: float
    pooled_tuning_tokens_per_second: float | None
    held_out_tokens_per_second: float
    pooled_held_out_tokens_per_second: float
    baseline_held_out_tokens_per_second: float
    held_out_rates: list[float]
    gain: float
    gain_low: float
    gain_high: float
    pays: bool
    why: str


class PerTypeResultJson(TypedDict):
    """A ``PerTypeResult`` as the study stores it (``store.write_per_type``) and the export carries and writes
    it (``Export.per_type``, export.json)."""

    rounds: int
    pooled: int
    baseline: int
    types: list[TypeResultJson]
    unsplit: dict[str, str]
    rule: str


@dataclass(frozen=True)
class PerTypeResult:
    rounds: int
    pooled: int
    baseline: int
    types: list[TypeResult]
    unsplit: dict[str, str] = field(default_factory=dict)  # suite -> why it has no per-type figure
    rule: str = RULE

    @property
    def paying(self) -> list[TypeResult]:
        return [t for t in self.types if t.pays]

    def to_json(self) -> PerTypeResultJson:
        return cast(PerTypeResultJson, asdict(self))

    @classmethod
    def from_json(cls, data: dict) -> PerTypeResult:
        return cls(**{**data, "types": [TypeResult(**t) for t in data["types"]]})


def race_per_type(
    ctx: StudyInputs, study: optuna.Study, pooled: TrialRecord, progress: Progress, rounds: int | None = None
) -> PerTypeResult | None:
    """Per-type winners on the tuning prompts, re-measured on the held-out prompts against the
    pooled winner and the baseline; stored with the study. None when there is no baseline."""
    baseline = store.baseline_record(study)
    if baseline is None:
        return None
    rounds = rounds or type_rounds(ctx.spec.race)
    splits, unsplit = split(ctx.workload)
    winners = type_winners(store.read_trials(study), splits)
    for suite in splits:
        if suite not in winners:
            unsplit[suite] = "no feasible trial has samples of its tuning prompts"
    if not winners:
        return PerTypeResult(rounds, pooled.number, baseline.number, [], unsplit)
    contenders: dict[object, TrialRecord] = {}
    for record in (pooled, baseline, *(w for w, _ in winners.values())):
        contenders.setdefault(record.config, record)
    held_out = restrict(ctx.workload, [i for suite in winners for i in splits[suite].held_out])
    progress(
        f"per-type race: {len(contenders)} configurations on {len(held_out.prompts)} held-out prompts "
        f"({', '.join(winners)}) x {rounds} rounds, one launch each per round"
    )
    measured = rounds_of_launches(
        [contender(label(r), r) for r in contenders.values()],
        held_out,
        ctx.settings,
        rounds,
        ctx.log_dir,
        progress,
    )

    def rates(record: TrialRecord, suite: str) -> list[float]:
        return measured[label(contenders[record.config])].per_suite[suite]

    types = [
        _type_result(
            suite,
            splits[suite],
            winner,
            tuning,
            pooled,
            (rates(winner, suite), rates(pooled, suite), rates(baseline, suite)),
        )
        for suite, (winner, tuning) in winners.items()
    ]
    result = PerTypeResult(rounds, pooled.number, baseline.number, types, unsplit)
    store.write_per_type(study, result.to_json())
    return result


def _type_result(
    suite: str,
    split_: Split,
    winner: TrialRecord,
    tuning: float,
    pooled: TrialRecord,
    held_out: tuple[list[float], list[float], list[float]],
) -> TypeResult:
    """One type's row: its winner on the tuning prompts, re-measured on the held-out ones (``held_out``: the
    winner's, the pooled winner's and the baseline's rates there, launch by launch)."""
    mine, theirs, base = held_out
    gain, low, high, pays, why = _verdict(winner.config == pooled.config, mine, theirs)
    return TypeResult(
        suite=suite,
        tuning_prompts=list(split_.tuning),
        held_out_prompts=list(split_.held_out),
        winner=winner.number,
        config=winner.config.as_dict(),
        pooled=pooled.number,
        tuning_tokens_per_second=tuning,
        pooled_tuning_tokens_per_second=tuning_rate(pooled, split_.tuning),
        held_out_tokens_per_second=evidence.geometric_mean(mine),
        pooled_held_out_tokens_per_second=evidence.geometric_mean(theirs),
        baseline_held_out_tokens_per_second=evidence.geometric_mean(base),
        held_out_rates=mine,
        gain=gain,
        gain_low=low,
        gain_high=high,
        pays=pays,
        why=why,
    )


def _verdict(same: bool, mine: list[float], theirs: list[float]) -> tuple[float, float, float, bool, str]:
    """(gain, its interval, whether the type's own winner pays, why) on the held-out prompts."""
    if same:
        return 1.0, 1.0, 1.0, False, "its winner on the tuning prompts is the pooled winner"
    ratio = evidence.ratio(mine, theirs)
    pays = ratio.enough and ratio.low > 1.0
    why = f"{ratio.text()} over the pooled winner on held-out prompts" + (
        ""
        if pays
        else ": too few rounds, no separate entry"
        if not ratio.enough
        else ": slower than the pooled winner there"
        if ratio.high < 1.0
        else ": within the noise, no separate entry"
    )
    return ratio.estimate, ratio.low, ratio.high, pays, why


def winner_lines(result: PerTypeResult) -> list[str]:
    """The per-type table an operator reads, and which types get their own entry."""
    lines = [
        f"per-type winners (picked on tuning prompts, re-measured on {HELD_OUT_MIN}+ held-out prompts per type "
        f"over {result.rounds} rounds against the pooled winner, trial {result.pooled}):",
        f"  {'type':<10} {'trial':>5} {'K':>3} {'draft':<12} {'tuning t/s':>10} {'held-out t/s':>12} "
        f"{'pooled held-out':>15} {'gain [95%]':>18}  entry",
    ]
    for entry in result.types:
        config = entry.config
        draft_max = config.get("draft_max") if config.get("spec_type", "none") != "none" else 0
        draft = method_of(config)
        gain = evidence.Ratio(entry.gain, entry.gain_low, entry.gain_high, len(entry.held_out_rates))
        lines.append(
            f"  {entry.suite:<10} {entry.winner:>5} {draft_max if draft_max is not None else '-':>3} {draft[:24]:<12} "
            f"{entry.tuning_tokens_per_second:>10.1f} {entry.held_out_tokens_per_second:>12.1f} "
            f"{entry.pooled_held_out_tokens_per_second:>15.1f} "
            f"{gain.text():>18}  {'yes' if entry.pays else 'no'}"
        )
    for entry in result.types:
        lines.append(f"  {entry.suite}: {'own entry' if entry.pays else 'no own entry'}: {entry.why}")
    for suite, why in result.unsplit.items():
        lines.append(f"  {suite}: no per-type figure: {why}")
    return lines
