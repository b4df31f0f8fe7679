"""The finalist race: a sequential, launch-level race whose winner an operator can deploy.

Why: a study's best trial is the highest of many noisy single measurements (a configuration
that got lucky once), and every launch of a server runs a few percent faster or slower than
the last. An operator copies the winner to a fleet of fresh launches, so the race compares
launches, not requests, and says how sure it is.

1. **Finalists** (``finalists``): the leader on drift-corrected rates (tokens/s over the
   sentinel rate at the trial's time, ``tuner.decisions.drift``) and every trial within reach of
   it: the gap is below z x sqrt(cv_a^2 + cv_b^2 + 2 launch^2), the launch spread from the
   study's sentinels (``drift.Sentinels.launch_spread``: a conservative prior until three exist). One per
   configuration, the closest first, at most ``race.max_finalists``.
2. **Selection rounds** (``sequential_race``): each round launches every remaining finalist
   (the baseline among them, until shown slower) once (``tuner.decisions.remeasure``, Williams order). From ``race.min_rounds``
   on, after each round the leader (highest geometric mean) is compared with each other
   finalist on paired per-round ratios (``tuner.decisions.evidence``): one *shown slower* is
   dropped (F-race), one *shown equivalent* within ``race.equivalence`` (TOST) is settled. The
   race stops when every other finalist is dropped or equivalent, or undecided at
   ``race.max_rounds`` / ``race.budget_minutes``; then it says so and deploys the higher
   estimate.
3. **Resources only between equals**: among the leader and those shown equivalent to it, fewer
   threads, then the smaller draft model (none is smallest) win; K is not a resource.
4. **Outlier rounds**: a launch far from the contender's other rounds (``evidence.is_outlier``)
   is launched again once; both figures are reported, the second is used.
5. **Confirmation**: the winner's printed speedup comes from ``race.confirm_rounds`` further
   rounds of the winner and the baseline alone, not used to pick it (no winner's curse).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import optuna

from tuner import eta
from tuner.context import StudyContext, study_estimate
from tuner.decisions import evidence
from tuner.decisions.drift import Sentinels
from tuner.decisions.remeasure import Contender, Launch, Remeasure, contender
from tuner.measurement.measure import MeasurementSettings
from tuner.measurement.workload import Workload
from tuner.storage import store
from tuner.storage.records import StudyRecord, TrialRecord
from tuner.studyfile.spec import RaceSpec

RESOURCE_RULE = (
    "among configurations shown equivalent: fewer threads, then the smaller draft model (none is smallest)"
)
Z = 2.0
OUTLIER_CONTEXT = 3  # other rounds a launch is compared with before it is judged an outlier


def label(record: TrialRecord) -> str:
    return f"trial-{record.number}"


def within_reach(scored: list[tuple[float, float]], launch: float) -> list[int]:
    """Indexes of (log rate, cv) pairs within reach of the best, closest first: the gap is below
    ``Z * sqrt(cv_best^2 + cv^2 + 2 launch^2)`` (each was measured in one launch of its own)."""
    if not scored:
        return []
    order = sorted(range(len(scored)), key=lambda i: scored[i][0], reverse=True)
    top, top_cv = scored[order[0]]
    return [
        i for i in order if top - scored[i][0] <= Z * math.sqrt(top_cv**2 + scored[i][1] ** 2 + 2 * launch**2)
    ]


def finalists(records: list[TrialRecord], noise_cv: float, max_finalists: int) -> list[TrialRecord]:
    """The leader on drift-corrected rates and the feasible trials within reach of it, closest first,
    one per configuration (raw rates when a trial has no sentinel to divide by)."""
    sentinels = Sentinels(records, noise_cv)
    pool = [r for r in records if r.feasible and r.role != "sentinel" and r.metrics.tokens_per_second > 0]
    corrected = [1.0 if r.role == "baseline" else sentinels.speedup(r) for r in pool]
    rates = corrected if all(corrected) else [r.metrics.tokens_per_second for r in pool]
    scored = [
        (math.log(rate), r.spread.cv if r.spread and r.spread.cv is not None else noise_cv)
        for rate, r in zip(rates, pool)
    ]
    chosen: dict = {}
    for i in within_reach(scored, sentinels.launch_spread()):
        chosen.setdefault(pool[i].config, pool[i])
    return list(chosen.values())[:max_finalists]


@dataclass
class Contest:
    """The evidence of a race so far: per label, one rate per selection round it was launched in."""

    rates: dict[str, list[float]]
    candidates: list[str]  # still racing (the baseline among them until shown slower: it may win)
    dropped: dict[str, str] = field(default_factory=dict)  # label -> why
    outliers: list[str] = field(default_factory=list)  # what was launched again, and both figures
    launches: int = 0
    vetted: set = field(default_factory=set)  # (label, round index) checked for an outlier


@dataclass(frozen=True)
class Outcome:
    winner: str
    decided: bool
    verdict: str  # one sentence: how the winner was decided
    equivalent: list[str]  # shown equivalent to the leader within the margin
    leader: str


def _add_round(contest: Contest, launched: dict[str, float], relaunch: Callable[[str], float]) -> None:
    """Append a round's rates, then launch again (once) any launch far from its contender's other rounds.

    Every launch is checked as soon as its contender has ``OUTLIER_CONTEXT`` other rounds (the first
    rounds are checked later, retroactively), and a launch measured again is not checked twice."""
    contest.launches += len(launched)
    for name, value in launched.items():
        contest.rates[name].append(value)
    for name in launched:
        rates = contest.rates[name]
        for i, value in enumerate(rates):
            if (name, i) in contest.vetted or (len(rates) - 1 < OUTLIER_CONTEXT and value > 0):
                continue
            contest.vetted.add((name, i))
            if evidence.is_outlier(value, rates[:i] + rates[i + 1 :]):
                again = relaunch(name)
                contest.launches += 1
                rates[i] = again
                contest.outliers.append(
                    f"round {i + 1}: {name} measured {value:.1f} t/s, far from its other "
                    f"rounds ({', '.join(f'{v:.1f}' for v in rates[:i] + rates[i + 1 :])}); "
                    f"launched again: {again:.1f} t/s (used)"
                )


def sequential_race(
    labels: list[str],
    baseline: str,
    launch_round: Callable[[list[str], int], dict[str, float]],
    relaunch: Callable[[str], float],
    resources: dict[str, tuple],
    spec: RaceSpec,
    progress: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Contest, Outcome]:
    """Selection rounds until the leader is shown better than or equivalent to every other finalist.

    ``launch_round(labels, round_index)`` launches each once and returns its rate; ``relaunch(label)``
    launches one again (an outlier); ``resources[label]`` orders equals (smaller first). Pure apart
    from those two calls, so ``make bench`` runs this same code on a simulated host."""
    everyone = list(dict.fromkeys([*labels, baseline]))
    contest = Contest({name: [] for name in everyone}, list(everyone))
    deadline = clock() + 60 * spec.budget_minutes if spec.budget_minutes else math.inf
    for r in range(spec.max_rounds):
        measured = list(contest.candidates)
        _add_round(contest, launch_round(measured, r), relaunch)
        outcome = _judge(contest, resources, spec, r + 1)
        eta.expect(progress, 0 if outcome else (spec.max_rounds - r - 1) * len(contest.candidates))
        progress(
            f"race round {r + 1}: "
            + ", ".join(f"{n} {contest.rates[n][-1]:.1f}" for n in measured)
            + f" t/s; {outcome.verdict if outcome else 'racing on'}"
        )
        if outcome is not None:
            return contest, outcome
        if clock() >= deadline and r + 1 >= evidence.MIN_ROUNDS:
            return contest, _undecided(contest, spec, f"the time budget ({spec.budget_minutes} min)", r + 1)
    return contest, _undecided(contest, spec, f"race.max_rounds ({spec.max_rounds})", spec.max_rounds)


def look_alpha(spec: RaceSpec) -> float:
    """Each look's error: ``evidence.ALPHA`` spent evenly over the looks the race may take (Bonferroni), so
    looking after every round does not multiply the chance of dropping the true best."""
    return evidence.ALPHA / (spec.max_rounds - max(spec.min_rounds, evidence.MIN_ROUNDS) + 1)


def _leader(contest: Contest) -> str:
    """The highest geometric mean; every candidate was launched in every round so far."""
    return max(contest.candidates, key=lambda n: evidence.geometric_mean(contest.rates[n]))


def _judge(contest: Contest, resources: dict[str, tuple], spec: RaceSpec, rounds: int) -> Outcome | None:
    """After a round: drop the finalists shown slower than the leader; an outcome once all others are settled."""
    if rounds < max(spec.min_rounds, evidence.MIN_ROUNDS):
        return None
    leader = _leader(contest)
    lead = contest.rates[leader]
    for other in [c for c in contest.candidates if c != leader]:
        if evidence.shown_better(lead, contest.rates[other], look_alpha(spec)):
            contest.candidates.remove(other)
            contest.dropped[other] = f"shown slower than {leader} after {rounds} rounds"
    others = [c for c in contest.candidates if c != leader]
    equivalent = [
        c
        for c in others
        if evidence.shown_equivalent(lead, contest.rates[c], spec.equivalence, look_alpha(spec))
    ]
    if len(equivalent) < len(others):
        return None
    winner = min([leader, *equivalent], key=lambda c: resources.get(c, ()))
    if not equivalent:
        verdict = f"{leader} shown faster than every other finalist after {rounds} rounds"
    else:
        verdict = (
            f"{leader} leads; {', '.join(equivalent)} shown equivalent to it within "
            f"{spec.equivalence:.0%} after {rounds} rounds"
            + (f"; {winner} deployed by the resource rule ({RESOURCE_RULE})" if winner != leader else "")
        )
    return Outcome(winner, True, verdict, equivalent, leader)


def _undecided(contest: Contest, spec: RaceSpec, limit: str, rounds: int) -> Outcome:
    leader = _leader(contest)
    lead = contest.rates[leader]
    open_ = [c for c in contest.candidates if c != leader]
    equivalent = [
        c
        for c in open_
        if evidence.shown_equivalent(lead, contest.rates[c], spec.equivalence, look_alpha(spec))
    ]
    verdict = (
        (
            f"undecided after {rounds} rounds ({limit} reached): {leader} has the higher estimate and is deployed; "
            f"not told apart from {', '.join(c for c in open_ if c not in equivalent)}"
        )
        if open_
        else f"{leader} is the only finalist left after {rounds} rounds"
    )
    return Outcome(leader, not open_, verdict, equivalent, leader)


@dataclass(frozen=True)
class Entry:
    trial: int
    label: str
    config: dict
    recorded_tokens_per_second: float
    rates: list[float]  # one launch per selection round it took part in
    mean_tokens_per_second: float  # geometric mean over those launches
    speedup: float  # geometric mean of paired per-round ratios over the baseline
    speedup_low: float
    speedup_high: float
    status: str  # winner, equivalent, leader, dropped: why, undecided
    accepted: list[int] = field(default_factory=list)  # accepted draft tokens per launch


@dataclass(frozen=True)
class Confirmation:
    """The winner and the baseline launched alone in further rounds: the figure an operator is told."""

    rounds: int
    winner_rates: list[float]
    baseline_rates: list[float]
    speedup: float
    low: float
    high: float

    def text(self) -> str:
        return evidence.Ratio(self.speedup, self.low, self.high, self.rounds).text()


@dataclass(frozen=True)
class RaceResult:
    rounds: int  # selection rounds
    baseline_trial: int
    entries: list[Entry]  # best estimate first
    winner: int  # trial number
    decided: bool
    verdict: str
    rule: str
    equivalence: float
    drafted: dict[
        str, int
    ]  # per label, tokens drafted during the race (0 for a speculative one: it did not draft)
    outliers: list[str]
    launches: int
    confirmation: Confirmation | None  # None when the baseline won

    @property
    def winning(self) -> Entry:
        return next(e for e in self.entries if e.trial == self.winner)

    def figure(self) -> str:
        """The winner's speedup and where it comes from."""
        if self.confirmation is None:
            return "x1.00: the baseline configuration won (nothing to confirm)"
        c = self.confirmation
        return (
            f"{c.text()} over the baseline, from {c.rounds} confirmation rounds (winner and baseline "
            f"launched alone, not used to pick it)"
        )

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RaceResult | None:
        """None for a race stored by an older version (one launch per contender, no verdict)."""
        if "verdict" not in data:
            return None
        confirmation = Confirmation(**data["confirmation"]) if data.get("confirmation") else None
        return cls(**{**data, "entries": [Entry(**e) for e in data["entries"]], "confirmation": confirmation})


def resource_key(record: TrialRecord, study: StudyRecord) -> tuple:
    c = record.config
    draft_bytes = (
        (study.drafts.get(c.draft) or {}).get("file_size_bytes", 0) if c.speculative and c.draft else 0
    )
    return (c.threads, draft_bytes)


def run_race(
    study: StudyRecord,
    candidates: list[TrialRecord],
    baseline: TrialRecord,
    workload: Workload,
    settings: MeasurementSettings,
    spec: RaceSpec,
    log_dir: Path,
    progress: Callable[[str], None] = print,
) -> RaceResult:
    """Selection rounds of launches, then confirmation rounds of the winner against the baseline."""
    records = {label(r): r for r in [*candidates, baseline]}
    contenders: dict[str, Contender] = {name: contender(name, r) for name, r in records.items()}
    progress = eta.as_progress(progress)
    remeasure = Remeasure(workload, settings, log_dir, progress)
    drafted = dict.fromkeys(records, 0)
    accepted: dict[str, list[int]] = {name: [] for name in records}
    watch = eta.Stopwatch(progress)  # seconds per launch so far: the time left is planned on them

    def rate(name: str, launched: Launch) -> float:
        drafted[name] += launched.drafted
        accepted[name].append(launched.accepted)
        return launched.rate

    def launch(name: str) -> float:
        return rate(name, watch.time(1, lambda: remeasure.launch(contenders[name])))

    def launch_round(names: list[str], r: int) -> dict[str, float]:
        launched = watch.time(len(names), lambda: remeasure.round([contenders[n] for n in names], r))
        return {name: rate(name, one) for name, one in launched.items()}

    progress.then_units = 2 * spec.confirm_rounds
    eta.expect(progress, spec.max_rounds * len(records))

    progress(
        f"race: {len(records)} finalists ({', '.join(records)}), one launch each per round, "
        f"{spec.min_rounds}-{spec.max_rounds} rounds until decided (equivalence margin {spec.equivalence:.0%})"
    )
    contest, outcome = sequential_race(
        [n for n in records if n != label(baseline)],
        label(baseline),
        launch_round,
        launch,
        {n: resource_key(r, study) for n, r in records.items()},
        spec,
        progress,
    )
    confirmation = None
    progress.then_units = 0
    if outcome.winner != label(baseline) and spec.confirm_rounds:
        progress.expect(2 * spec.confirm_rounds)
        progress(
            f"race: confirming {outcome.winner} against the baseline in {spec.confirm_rounds} fresh rounds"
        )
        confirmation, check = confirm(
            outcome.winner, label(baseline), launch_round, launch, spec.confirm_rounds
        )
        contest.outliers += [f"confirmation {line}" for line in check.outliers]
        contest.launches += check.launches
    progress.plan(progress.then_s)  # what follows the race (an export's per-type race)
    entries = _entries(contest, outcome, records, label(baseline), accepted)
    return RaceResult(
        max(len(v) for v in contest.rates.values()),
        baseline.number,
        entries,
        records[outcome.winner].number,
        outcome.decided,
        outcome.verdict,
        RESOURCE_RULE,
        spec.equivalence,
        drafted,
        contest.outliers,
        contest.launches,
        confirmation,
    )


def confirm(
    winner: str,
    baseline: str,
    launch_round: Callable[[list[str], int], dict[str, float]],
    relaunch: Callable[[str], float],
    rounds: int,
) -> tuple[Confirmation, Contest]:
    """The winner and the baseline alone for ``rounds`` fresh rounds: the speedup the operator is told."""
    pair = [winner, baseline]
    check = Contest({n: [] for n in pair}, list(pair))
    for r in range(rounds):
        _add_round(check, launch_round(pair, r), relaunch)
    ratio = evidence.ratio(check.rates[winner], check.rates[baseline])
    return Confirmation(
        rounds, check.rates[winner], check.rates[baseline], ratio.estimate, ratio.low, ratio.high
    ), check


def _entries(
    contest: Contest,
    outcome: Outcome,
    records: dict[str, TrialRecord],
    baseline: str,
    accepted: dict[str, list[int]],
) -> list[Entry]:
    entries = []
    base = contest.rates[baseline]
    for name, rates in contest.rates.items():
        r = records[name]
        common = min(len(rates), len(base))  # the baseline or this finalist may have been dropped first
        ratio = evidence.ratio(rates[:common], base[:common])
        status = (
            "winner"
            if name == outcome.winner
            else "equivalent"
            if name in outcome.equivalent
            else f"dropped: {contest.dropped[name]}"
            if name in contest.dropped
            else "leader"
            if name == outcome.leader
            else "undecided"
        )
        entries.append(
            Entry(
                r.number,
                name,
                r.config.as_dict(),
                r.metrics.tokens_per_second,
                rates,
                evidence.geometric_mean(rates),
                ratio.estimate,
                ratio.low,
                ratio.high,
                status,
                accepted[name],
            )
        )
    return sorted(entries, key=lambda e: (len(e.rates), e.mean_tokens_per_second), reverse=True)


def race_study(
    ctx: StudyContext,
    study: optuna.Study,
    progress: Callable[[str], None] = print,
    candidates: list[TrialRecord] | None = None,
) -> RaceResult | None:
    """Race a study's finalists (or the given candidates) against its baseline; stored with the study.
    None when there is nothing to race: no feasible trial other than the baseline itself."""
    base = store.baseline_record(study)
    if base is None:
        return None
    pool = (
        candidates
        if candidates is not None
        else finalists(store.read_trials(study), ctx.settings.noise_cv, ctx.spec.race.max_finalists)
    )
    pool = [r for r in pool if r.config != base.config]
    if not pool:
        return None
    progress = eta.as_progress(progress)
    if progress.unit_s is None:  # no trial measured in this command: a launch as the study estimates it
        progress.unit_s = study_estimate(ctx).launch_s
    result = run_race(
        store.read_study_record(study),
        pool,
        base,
        ctx.workload,
        ctx.settings,
        ctx.spec.race,
        ctx.log_dir,
        progress,
    )
    store.write_race(study, result.to_json())
    return result


def describe(result: RaceResult) -> list[str]:
    """What an operator reads: the table, the verdict, outliers, and the winner's confirmed figure."""
    lines = [
        f"race: {result.rounds} selection rounds, {result.launches} launches (per finalist: geometric mean "
        f"tokens/s over its launches; speedup over the baseline on paired rounds, 95% t-interval):"
    ]
    for e in result.entries:
        mark = "*" if e.trial == result.winner else " "
        ratio = evidence.Ratio(e.speedup, e.speedup_low, e.speedup_high, len(e.rates))
        lines.append(
            f" {mark} trial {e.trial:>3}: {e.mean_tokens_per_second:8.1f} t/s over {len(e.rates)} launches (recorded "
            f"{e.recorded_tokens_per_second:.1f}), {ratio.text()} | {e.status} | "
            + " ".join(f"{k}={v}" for k, v in e.config.items())
        )
    lines.append(f"verdict: {result.verdict}")
    lines += [f"outlier: {line}" for line in result.outliers]
    w = result.winning
    lines.append(f"winner: trial {w.trial}, {result.figure()}")
    return lines
