"""The finalist race: a winner declared on fresh, interleaved measurements, with an interval.

Why: a study's best trial is the highest of many noisy single measurements, so it is
biased upwards (a configuration that got lucky once). Before a winner is declared (end
of ``tuner run``, and ``tuner export``), the leader, every feasible configuration whose
tokens/s interval overlaps the leader's (at most ``race.max_finalists``, the closest
first) and the baseline are all served at once and re-measured for ``race.rounds``
rounds, each round one pass of the workload on each in a freshly shuffled order
(``tuner.decisions.remeasure``). The decision uses these fresh rates only:

- each finalist's figure is its median over rounds;
- the winner's speedup is its median over the baseline's, with a 95% bootstrap interval
  over rounds (rounds resampled as pairs: both sides of a round saw the same machine);
- when the best two cannot be told apart (the bootstrap interval of their ratio holds
  1.0) the race says so and picks by ``TIE_RULE``: fewer threads (cores left free), then
  the smaller draft model, then the shorter draft length K, then the earlier trial.

A trial's interval for "overlaps the leader's" is tokens/s x (1 +- 2 cv), with the
study's noise_cv where the trial's own spread is unknown.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import optuna

from tuner.storage import store
from tuner.context import StudyContext
from tuner.measurement.measure import MeasurementSettings
from tuner.storage.records import StudyRecord, TrialRecord
from tuner.decisions.remeasure import Contender, alternate
from tuner.measurement.workload import Workload

TIE_RULE = "fewer threads, then the smaller draft model, then the shorter draft length K, then the earlier trial"
BOOTSTRAP_SAMPLES = 2000
CONFIDENCE = 0.95


def interval(record: TrialRecord, noise_cv: float) -> tuple[float, float]:
    cv = record.spread.cv if record.spread and record.spread.cv is not None else noise_cv
    tps = record.metrics.tokens_per_second
    return tps * (1 - 2 * cv), tps * (1 + 2 * cv)


def finalists(records: list[TrialRecord], noise_cv: float, max_finalists: int) -> list[TrialRecord]:
    """The leader and the feasible trials within reach of it, closest first, one per configuration."""
    feasible = sorted((r for r in records if r.feasible and r.role != "sentinel"),
                      key=lambda r: r.metrics.tokens_per_second, reverse=True)
    if not feasible:
        return []
    low = interval(feasible[0], noise_cv)[0]
    chosen: dict = {}
    for r in feasible:
        if interval(r, noise_cv)[1] >= low and r.config not in chosen:
            chosen[r.config] = r
    return list(chosen.values())[:max_finalists]


@dataclass(frozen=True)
class Entry:
    trial: int
    label: str
    config: dict
    recorded_tokens_per_second: float
    rates: list[float]  # one pooled tokens/s per round
    median: float
    speedup: float  # median over the baseline's median
    speedup_low: float
    speedup_high: float


@dataclass(frozen=True)
class RaceResult:
    rounds: int
    baseline_trial: int
    entries: list[Entry]  # finalists, best median first (the baseline included, as a finalist or not)
    winner: int  # trial number
    tied_with: int | None  # the runner-up it could not be told apart from, when the tie rule decided
    rule: str
    drafted: dict[str, int]  # per label, tokens drafted during the race (0 for a speculative one: it did not draft)

    @property
    def winning(self) -> Entry:
        return next(e for e in self.entries if e.trial == self.winner)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RaceResult:
        return cls(**{**data, "entries": [Entry(**e) for e in data["entries"]]})


def bootstrap_ratio(a: list[float], b: list[float], seed: int) -> tuple[float, float]:
    """The 95% interval of median(a)/median(b) with rounds resampled in pairs."""
    rng = random.Random(seed)
    n = len(a)
    ratios = []
    for _ in range(BOOTSTRAP_SAMPLES):
        idx = [rng.randrange(n) for _ in range(n)]
        ratios.append(statistics.median(a[i] for i in idx) / statistics.median(b[i] for i in idx))
    ratios.sort()
    tail = (1 - CONFIDENCE) / 2
    return ratios[int(tail * len(ratios))], ratios[min(int((1 - tail) * len(ratios)), len(ratios) - 1)]


def tie_key(record: TrialRecord, study: StudyRecord) -> tuple:
    c = record.config
    draft_bytes = (study.drafts.get(c.draft) or {}).get("file_size_bytes", 0) if c.speculative and c.draft else 0
    return (c.threads, draft_bytes, c.draft_max or 0, record.number)


def decide(rates: dict[int, list[float]], baseline: int, records: dict[int, TrialRecord], study: StudyRecord,
           seed: int = 0) -> tuple[list[Entry], int, int | None]:
    """Entries best first, the winner's trial number, and the runner-up it tied with (if any)."""
    base = rates[baseline]
    base_median = statistics.median(base)
    entries = []
    for number, values in rates.items():
        low, high = bootstrap_ratio(values, base, seed)
        r = records[number]
        entries.append(Entry(number, label(r), r.config.as_dict(), r.metrics.tokens_per_second, values,
                             statistics.median(values), statistics.median(values) / base_median, low, high))
    entries.sort(key=lambda e: e.median, reverse=True)
    best = entries[0]
    if len(entries) < 2:
        return entries, best.trial, None
    runner_up = entries[1]
    low, high = bootstrap_ratio(rates[best.trial], rates[runner_up.trial], seed)
    if low <= 1.0 <= high:
        first, second = sorted((best.trial, runner_up.trial), key=lambda n: tie_key(records[n], study))
        return entries, first, second
    return entries, best.trial, None


def label(record: TrialRecord) -> str:
    return f"trial-{record.number}"


def run_race(study: StudyRecord, candidates: list[TrialRecord], baseline: TrialRecord, workload: Workload,
             settings: MeasurementSettings, rounds: int, seed: int, log_dir: Path,
             progress: Callable[[str], None] = print) -> RaceResult:
    """Serve the finalists and the baseline at once, re-measure them, decide on those rounds only."""
    contenders = {r.number: r for r in [*candidates, baseline]}
    progress(f"race: {len(contenders)} finalists ({', '.join(label(r) for r in contenders.values())}) "
             f"x {rounds} rounds, shuffled order each round")
    measured = alternate([Contender(label(r), r.argv, r.config.temperature) for r in contenders.values()],
                         workload, settings, rounds, log_dir, progress, shuffle_seed=seed)
    rates = {n: measured[label(r)].tokens_per_second for n, r in contenders.items()}
    entries, winner, tied = decide(rates, baseline.number, contenders, study, seed)
    return RaceResult(rounds, baseline.number, entries, winner, tied, TIE_RULE,
                      {label(r): measured[label(r)].drafted for r in contenders.values()})


def race_study(ctx: StudyContext, study: optuna.Study, progress: Callable[[str], None] = print,
               candidates: list[TrialRecord] | None = None) -> RaceResult | None:
    """Race a study's finalists (or the given candidates) against its baseline; stored with the study.
    None when there is nothing to race: no feasible trial other than the baseline itself."""
    base = store.baseline_record(study)
    if base is None:
        return None
    pool = candidates if candidates is not None else finalists(
        store.read_trials(study), ctx.settings.noise_cv, ctx.spec.race.max_finalists)
    pool = [r for r in pool if r.config != base.config]
    if not pool:
        return None
    result = run_race(store.read_study_record(study), pool, base, ctx.workload, ctx.settings,
                      ctx.spec.race.rounds, ctx.spec.race.seed, ctx.log_dir, progress)
    store.write_race(study, result.to_json())
    return result


def describe(result: RaceResult) -> list[str]:
    """What an operator reads: the table, the winner with its interval, and any tie."""
    lines = [f"race over {result.rounds} rounds (median tokens/s; speedup over the baseline, 95% bootstrap interval):"]
    for e in result.entries:
        mark = "*" if e.trial == result.winner else " "
        lines.append(f" {mark} trial {e.trial:>3}: {e.median:8.1f} t/s (recorded {e.recorded_tokens_per_second:.1f}), "
                     f"x{e.speedup:.2f} [{e.speedup_low:.2f}, {e.speedup_high:.2f}] | "
                     + " ".join(f"{k}={v}" for k, v in e.config.items()))
    w = result.winning
    lines.append(f"winner: trial {w.trial}, x{w.speedup:.2f} over the baseline [95% interval {w.speedup_low:.2f}-"
                 f"{w.speedup_high:.2f}], {w.median:.1f} tokens/s")
    if result.tied_with is not None:
        lines.append(f"trials {result.winner} and {result.tied_with} cannot be told apart in {result.rounds} rounds; "
                     f"picked by the rule: {result.rule}")
    return lines
