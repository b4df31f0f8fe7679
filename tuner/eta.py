"""Time: what a study should take before it runs, and elapsed / remaining time on every progress line.

Why: a study and its race can run for an hour on a big model, and an operator decides whether to wait
from the first line. The estimate (``estimate``) is the workload's tokens against the model's size and
this machine's measured memory bandwidth (the roofline of decode without speculation), plus server
launches and the race at its most rounds; ``TimePlan`` gives every progress line (``tuner.progress``) the time
elapsed and an estimate of the time left, re-planned from measured trial and launch times as they come in.
Pure: no import from the rest of the tuner, so every stage (the llama.cpp build too) can print with it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

T = TypeVar("T")

# Decode reaches about this share of the copy probe's bandwidth (STREAM-counted read + write): between the
# shares of the models it was calibrated on (evidence: docs/decisions.md#decode-efficiency) ...
DECODE_EFFICIENCY = 0.75
# ... and costs at least this much per token whatever the model's size (graph, sampling, HTTP chunking).
TOKEN_FLOOR_S = 0.001
PROMPT_BATCH = 8.0  # prompt tokens are processed this many times faster than decoded ones
REQUEST_S = 0.01  # per request: HTTP, tokenization, slot setup
BATCH_COST = 0.35  # each extra simultaneous user slows a decode step by this share
LAUNCH_S = 0.5  # llama-server start, context and graph setup, readiness (0.3-0.5 s: the synthetic target)
LOAD_BYTES_PER_S = 1.5e9  # model files read (page cache or disk) while the server loads
CHARS_PER_TOKEN = 3.5  # prompt length in tokens, without a tokenizer
# A searched trial of a space that speculates decodes this much faster than the target alone, on average over
# the ones that pay and the ones that do not: a search spends some of its trials on configurations that lose ...
SEARCH_SPEEDUP = 1.2
# ... and with pruning on, about this share of the trials stops about this far into its passes: a trial stops
# once it cannot beat the incumbent, which a slow configuration shows partway through its requests.
PRUNED_SHARE, PRUNED_AT = 0.35, 0.5
# Launches per round after race.min_rounds: at most the leader, the runner-up, the bound's finalist and the
# baseline; typically two: the baseline rests once shown slower, and the bound's finalist is usually the
# runner-up.
RACE_OPEN, RACE_TYPICAL = 4, 2


@dataclass(frozen=True)
class Machine:
    """How fast this machine decodes the target and launches a server with its models."""

    token_s: float  # seconds per decoded token of the target alone
    launch_s: float  # server start and model load
    decode_bound: str  # "bandwidth" or "overhead": which limit set token_s
    bytes_per_token: float = 0.0  # the target's weights read per token (active experts only)
    bandwidth: float = 0.0  # bytes/s, the copy probe's


def machine(weights_bytes: float, files_bytes: float, bandwidth: float) -> Machine:
    """The target's decode time per token: its weights read once per token at DECODE_EFFICIENCY of the
    measured bandwidth, at least TOKEN_FLOOR_S; a launch reads every model file once."""
    per_token = weights_bytes / (bandwidth * DECODE_EFFICIENCY) if bandwidth > 0 else TOKEN_FLOOR_S
    return Machine(
        max(per_token, TOKEN_FLOOR_S),
        LAUNCH_S + files_bytes / LOAD_BYTES_PER_S,
        "bandwidth" if per_token >= TOKEN_FLOOR_S else "overhead",
        weights_bytes,
        bandwidth,
    )


def prompt_tokens(text: str) -> int:
    return max(1, round(len(text) / CHARS_PER_TOKEN))


def request_s(machine: Machine, prompt: int, n_predict: int, users: int = 1, speedup: float = 1.0) -> float:
    """One request: its prompt, n_predict decoded tokens (slower per step with more users at once, faster by
    ``speedup`` with speculation)."""
    decode = n_predict * machine.token_s * (1 + BATCH_COST * (users - 1)) / speedup
    return REQUEST_S + prompt * machine.token_s / PROMPT_BATCH + decode


def pass_s(machine: Machine, prompts: Sequence[int], n_predict: int, speedup: float = 1.0) -> float:
    return sum(request_s(machine, p, n_predict, 1, speedup) for p in prompts)


def levels_s(
    machine: Machine, prompts: Sequence[int], n_predict: int, levels: Sequence[int], speedup: float = 1.0
) -> float:
    """Each concurrency level: every client sends ceil(prompts / users) requests, all at once."""
    mean = sum(prompts) / len(prompts) if prompts else 0
    return sum(
        math.ceil(len(prompts) / u) * request_s(machine, round(mean), n_predict, u, speedup) for u in levels
    )


def race_launches(rounds: int, min_rounds: int, contenders: int, per_round: int = RACE_OPEN) -> int:
    """A race's launches when it runs all its rounds: every contender in each of the first ``min_rounds`` rounds,
    then ``per_round`` a round (``tuner.decisions.race``: the leader, the runner-up, the finalist that sets the
    loss bound, the baseline while the leader is not shown faster; ``RACE_OPEN`` at most, ``RACE_TYPICAL``
    typically)."""
    first = min(min_rounds, rounds)
    return first * contenders + (rounds - first) * min(contenders, per_round)


@dataclass(frozen=True)
class Phase:
    """Launches after the trials: a race of ``tuner run`` or one that ``tuner export`` runs, at its most."""

    what: str
    launches: int  # at most
    launch_s: float
    how: str  # what is counted, for the --check line
    typical: int  # launches, typically

    @property
    def seconds(self) -> float:
        return self.launches * self.launch_s

    @property
    def typical_s(self) -> float:
        return self.typical * self.launch_s


@dataclass(frozen=True)
class Estimate:
    """A study's expected time on this machine: its trials (with sentinels), its race at the most, and the
    races its export runs (per content type, per load class) at the most."""

    machine: Machine
    trials: int
    sentinels: int
    trial_s: float  # a searched trial: launch, warm-up, repetitions x the workload, the levels
    budget_s: float | None  # budget.minutes: the trials stop there
    race_launches: int  # at most (``race_launches``) + confirm_rounds x 2
    race_typical: int  # launches of a race run to its last round, typically (RACE_TYPICAL a round)
    launch_s: float  # one race launch: start, warm-up, one pass
    finalists: int  # at most: race.max_finalists, or every trial but the baseline
    race_budget_s: float | None
    reference_s: float  # the baseline and each sentinel: the target alone, never pruned
    speedup: float  # SEARCH_SPEEDUP when the space speculates
    pruned: float  # the share of a searched trial's passes pruning saves on average
    warm_s: float  # a launch's warm-up
    export: tuple[Phase, ...] = ()  # ``with_export``

    @property
    def trials_s(self) -> float:
        total = (
            max(self.trials - 1, 0) * self.trial_s + (min(self.trials, 1) + self.sentinels) * self.reference_s
        )
        return min(total, self.budget_s) if self.budget_s else total

    @property
    def race_s(self) -> float:
        return self._race_time(self.race_launches)

    @property
    def export_s(self) -> float:
        return sum(p.seconds for p in self.export)

    @property
    def export_typical_s(self) -> float:
        return sum(p.typical_s for p in self.export)

    @property
    def race_typical_s(self) -> float:
        return self._race_time(self.race_typical)

    def _race_time(self, launches: int) -> float:
        """``launches`` race launches, cut at race.budget_minutes."""
        total = launches * self.launch_s
        return min(total, self.race_budget_s) if self.race_budget_s else total

    def expected_s(self, race: bool = True) -> float:
        """The trials, then (with ``race``) every race run to its last round with its typical launches."""
        return self.trials_s + (self.race_typical_s + self.export_typical_s if race else 0.0)


@dataclass(frozen=True)
class Passes:
    """What a trial measures: each request's prompt tokens (``prompts``), the tokens decoded per request, the
    warm-up requests, the passes over the prompts and the concurrency levels."""

    prompts: Sequence[int]
    n_predict: int
    warmup: int = 1
    repetitions: int = 1
    levels: Sequence[int] = ()


@dataclass(frozen=True)
class SearchPlan:
    """The trials a study runs: how many, a sentinel every ``sentinel_every`` trials or ``sentinel_minutes``
    (whichever comes first), budget.minutes; whether the space speculates and pruning is on."""

    trials: int
    sentinel_every: int | None = None
    sentinel_minutes: float | None = None
    budget_minutes: float | None = None
    speculative: bool = False
    prune: bool = False


@dataclass(frozen=True)
class RacePlan:
    """A study's race as its settings have it: race.max_rounds (``rounds``), race.max_finalists,
    race.confirm_rounds, race.budget_minutes and race.min_rounds."""

    rounds: int
    finalists: int
    confirm_rounds: int
    minutes: float | None = None
    min_rounds: int = 3


def estimate(machine: Machine, passes: Passes, search: SearchPlan, race: RacePlan) -> Estimate:
    """Trials x (launch + warm-up + repetitions x the workload + the levels), a sentinel every
    ``sentinel_every`` trials or ``sentinel_minutes`` (whichever comes first), and the race: at most
    ``race.rounds`` rounds of the finalists and the baseline (``race_launches``), then the confirmation rounds,
    each launch a warm-up and one pass. ``passes.prompts``: each request's prompt tokens. Searched trials decode
    ``SEARCH_SPEEDUP`` faster when the space is ``speculative`` and lose ``PRUNED_SHARE x (1 - PRUNED_AT)`` of
    their passes to pruning when ``prune``. Export's races: ``with_export``."""
    prompts, n_predict, warmup, repetitions, levels = (
        passes.prompts,
        passes.n_predict,
        passes.warmup,
        passes.repetitions,
        passes.levels,
    )
    trials, sentinel_every, sentinel_minutes = search.trials, search.sentinel_every, search.sentinel_minutes
    budget_minutes, speculative, prune = search.budget_minutes, search.speculative, search.prune
    race_rounds, finalists, confirm_rounds = race.rounds, race.finalists, race.confirm_rounds
    race_minutes, min_rounds = race.minutes, race.min_rounds
    speedup = SEARCH_SPEEDUP if speculative else 1.0
    saved = PRUNED_SHARE * (1 - PRUNED_AT) if prune else 0.0
    warm = warmup * request_s(machine, prompts[0], n_predict) if prompts else 0.0

    def trial(trial_speedup: float, cut: float) -> float:
        measured = repetitions * pass_s(machine, prompts, n_predict, trial_speedup) + levels_s(
            machine, prompts, n_predict, levels, trial_speedup
        )
        return machine.launch_s + warm + (1 - cut) * measured

    raced = min(finalists, max(trials - 1, 1))
    launch = machine.launch_s + warm + pass_s(machine, prompts, n_predict, speedup)
    by_time = int(trials * trial(1.0, 0.0) / (60 * sentinel_minutes)) if sentinel_minutes else 0
    return Estimate(
        machine=machine,
        trials=trials,
        sentinels=max(trials // sentinel_every if sentinel_every else 0, by_time),
        trial_s=trial(speedup, saved),
        budget_s=budget_minutes * 60 if budget_minutes else None,
        race_launches=race_launches(race_rounds, min_rounds, raced + 1) + 2 * confirm_rounds,
        race_typical=race_launches(race_rounds, min_rounds, raced + 1, RACE_TYPICAL) + 2 * confirm_rounds,
        launch_s=launch,
        finalists=raced,
        race_budget_s=race_minutes * 60 if race_minutes else None,
        reference_s=trial(1.0, 0.0),
        speedup=speedup,
        pruned=saved,
        warm_s=warm,
    )


def with_export(
    est: Estimate,
    passes: Passes,
    race: RacePlan,
    held_out: Sequence[int] = (),
    types: int = 0,
    type_rounds: int = 4,
) -> Estimate:
    """``est`` with the races ``tuner export`` runs after the pooled one: ``types`` content types on their
    ``held_out`` prompts for ``type_rounds`` rounds, and each load class (``passes.levels`` beyond one user) raced
    like the pooled race (``race``'s rounds and min_rounds), each launch one level."""
    prompts, n_predict, levels = passes.prompts, passes.n_predict, passes.levels
    machine, warm, speedup = est.machine, est.warm_s, est.speedup
    race_shape = (race.rounds, race.min_rounds, est.finalists + 1)  # max rounds, min rounds, contenders
    phases = []
    if types >= 2 and held_out:
        phases.append(
            Phase(
                "per-type race",
                type_rounds * (types + 2),
                machine.launch_s + warm + pass_s(machine, held_out, n_predict, speedup),
                f"{type_rounds} rounds x {types} type winners, the pooled winner and the baseline, on "
                f"{len(held_out)} held-out requests",
                type_rounds * min(types + 2, RACE_OPEN + 1),  # type winners are often the pooled winner
            )
        )
    classes = [u for u in levels if max(levels) > 1]
    if classes:
        per_class = race_launches(*race_shape)
        phases.append(
            Phase(
                "load classes",
                per_class * len(classes),
                machine.launch_s
                + warm
                + levels_s(machine, prompts, n_predict, classes, speedup) / len(classes),
                f"{len(classes)} classes x at most {per_class} launches, each one level",
                race_launches(*race_shape, RACE_TYPICAL) * len(classes),
            )
        )
    return replace(est, export=tuple(phases))


def duration(seconds: float) -> str:
    """45s, 3m12s, 1h05m."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


class TimePlan:
    """The time elapsed since a command started and the time left of the work in progress. ``plan`` sets the
    seconds left now (they count down until the next plan); ``expect(units)`` plans ``units`` + ``then_units`` of
    ``unit_s`` each (launches of a race, then its confirmation), plus ``then_s`` for what follows the phase."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.started = clock()
        self.unit_s: float | None = None
        self.then_units = 0
        self.then_s = 0.0
        self._left: float | None = None
        self._at = self.started

    def plan(self, seconds: float | None) -> None:
        self._left, self._at = seconds, self.clock()

    def expect(self, units: int) -> None:
        if self.unit_s is not None:
            self.plan((units + self.then_units) * self.unit_s + self.then_s)

    def elapsed(self) -> float:
        return self.clock() - self.started

    def remaining(self) -> float | None:
        return None if self._left is None else max(0.0, self._left - (self.clock() - self._at))

    def suffix(self) -> str:
        """``3m12s elapsed, ~1m05s left``; once a phase outlasts its plan, by how much: ``~0s left (40s over the
        estimate)``."""
        left, over = self.remaining(), self.overdue()
        tail = f", ~{duration(left)} left" if left is not None else ""
        return f"{duration(self.elapsed())} elapsed{tail}" + (
            f" ({duration(over)} over the estimate)" if over else ""
        )

    def overdue(self) -> float:
        """Seconds the work in progress has run past its plan (0 when on time or nothing is planned)."""
        if not self._left:
            return 0.0
        over = self.clock() - self._at - self._left
        return over if over >= 1.0 else 0.0


class Stopwatch:
    """Seconds per unit of the phase in progress, as measured: each timed call updates the plan's ``unit_s``."""

    def __init__(self, plan: TimePlan):
        self.time_plan = plan
        self.spent: list[float] = []

    def time(self, units: int, work: Callable[[], T]) -> T:
        started = self.time_plan.clock()
        result = work()
        self.spent += [(self.time_plan.clock() - started) / max(units, 1)] * max(units, 1)
        self.time_plan.unit_s = mean(self.spent)
        return result


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


class RunClock:
    """The time left in a run, planned on its command's TimePlan: the trials not yet counted at the time per trial
    measured so far in this run (the estimate before the first), then the race, scaled by how far the
    measured trials are off the estimate. The scaled launch time is left for the race (``unit_s``)."""

    def __init__(self, plan: TimePlan, estimate: Estimate, budget: int, race: bool, deadline: float | None):
        self.time_plan, self.estimate, self.budget, self.race, self.deadline = (
            plan,
            estimate,
            budget,
            race,
            deadline,
        )
        self.first: tuple[int, float] | None = None  # trials counted, and when, at the first plan

    def replan(self, counted: int) -> None:
        now = time.monotonic()
        self.first = self.first or (counted, now)
        done = counted - self.first[0]
        planned = self.estimate.trials_s / max(self.estimate.trials, 1)  # sentinels included
        per_trial = (now - self.first[1]) / done if done > 0 else planned
        trials_s = max(0, self.budget - counted) * per_trial
        if self.deadline is not None:
            trials_s = min(trials_s, max(0.0, self.deadline - now))
        scale = min(10.0, max(0.1, per_trial / planned)) if planned else 1.0
        self.time_plan.unit_s = self.estimate.launch_s * scale
        self.time_plan.plan(trials_s + (self.estimate.race_typical_s * scale if self.race else 0.0))
