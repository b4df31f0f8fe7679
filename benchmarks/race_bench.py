"""The decision procedure's error rates, on a simulated host with launch effects, beside a fixed reference.

Why: a race, a pruning rule or a finalist cut is a bet an operator copies to a fleet; its error
rate must be known, and a real 2-core VM cannot show it in any reasonable time. Here a
configuration's launch measures ``true rate x exp(launch effect + round noise)`` (lognormal,
a launch spread and a per-round spread as on the research hosts), with a 2% chance of an
outlier round at a tenth of the rate (a real host's launches occasionally collapse like that). The
product's own code decides (``tuner.decisions.race.sequential_race`` and ``confirm``,
``tuner.decisions.race.within_reach``, ``tuner.search.pruning.should_prune``); the reference is the
rules that the product's rules replaced (``benchmarks.previous_rules``, printed as "previous" and "old"), so that a
change to the product's rules is judged against a fixed bar.

Figures, per cell: interval coverage of the printed speedup; how often the loss bound the race states holds
(the true loss of the deployed configuration is below it) and its median; the probability of deploying a
configuration 3% or more slower than the best, over all races and among those that said they decided (with
how many did); how often an equal configuration is pruned (against one equal incumbent, and against the
best of 5 equal trials); how often the true best is a finalist; launches per race and modelled minutes.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import asdict, dataclass

from benchmarks import previous_rules, race_told_the_truth
from benchmarks.table import markdown_table
from tuner.decisions import evidence
from tuner.decisions.drift import PRIOR_LAUNCH_SIGMA, allowed_launch_spread
from tuner.decisions.race import LoopOptions, confirm, race_alpha, sequential_race, within_reach
from tuner.progress import Progress
from tuner.search.pruning import should_prune
from tuner.studyfile.spec import RaceSpec

LAUNCH_SPREADS = (0.03, 0.05, 0.10)
ROUND_SPREADS = (0.02, 0.05, 0.10)
GAPS = (0.0, 0.03, 0.05)
DEFAULT_HOST = (0.05, 0.05)  # launch, round spread
OUTLIER_P = 0.02
SLOWER = 0.03  # deploying a configuration this much slower than the best is a wrong deployment
MINUTES_PER_LAUNCH = 1.5  # a 32B-scale host: a launch with its warm-up and one pass takes one to two minutes
ROUND_BUDGETS = (10, 20, 30, 40)  # race.max_rounds tried at the default host and a 3% gap
TARGETS = {
    "holds": 0.95,
    "wrong": 0.05,
    "coverage": 0.93,
    "pruned": 0.05,
    "finalist": 0.95,
    "launches": 1.5,
    "cap": 1.0,  # the median stated loss at the cap, over the previous allocation's (at most)
}
ENOUGH_DECIDED = 20  # below this many decided races a cell's wrong-when-decided rate is printed, not judged
DEFAULT_HOST_RUNS = 10  # the default host's cells run this many times the races: at 400 a cell decides 10-40
# races, too few to tell a wrong-when-decided rate near twice the target from the target itself


def noisy(mu: float, launch_effect: float, round_sigma: float, rng: random.Random) -> float:
    rate = mu * math.exp(launch_effect + rng.gauss(0, round_sigma))
    return rate * 0.1 if rng.random() < OUTLIER_P else rate


def field_of(gap: float) -> tuple[list[float], list[tuple]]:
    """Four finalists and the baseline (last): the best, one ``gap`` slower with fewer threads (so a
    resource rule favours it), two clearly slower; the baseline at 0.6."""
    mus = [1.0, 1.0 - gap, 0.92, 0.88, 0.6]
    resources = [(2, 1), (1, 1), (2, 1), (2, 1), (2, 0)]
    return mus, resources


@dataclass(frozen=True)
class Race:
    """One simulated race: what it deployed and what it said."""

    winner: int
    ratio: evidence.Ratio  # the printed speedup over the baseline
    launches: int
    decided: bool
    loss: float | None  # the stated loss bound (fraction); None for the reference rules (they state none)
    capped: bool = False  # ran to its cap (race.max_rounds)


def _launcher(mus: list[float], launch_sigma: float, round_sigma: float, rng: random.Random):
    def launch(candidate: int) -> float:
        return noisy(mus[candidate], rng.gauss(0, launch_sigma), round_sigma, rng)

    return launch


def host_draws(
    mus: list[float], launch_sigma: float | list[float], round_sigma: float, rng: random.Random, rounds: int
) -> list[list[float]]:
    """Per configuration, what its launch in each round would measure: drawn before the race, so two allocations
    raced on them launch the same configuration in the same round to the same rate (the same simulated race).
    ``launch_sigma``: one spread for every configuration, or one each."""
    sigmas = launch_sigma if isinstance(launch_sigma, list) else [launch_sigma] * len(mus)
    return [
        [noisy(mu, rng.gauss(0, sigma), round_sigma, rng) for _ in range(rounds)]
        for mu, sigma in zip(mus, sigmas)
    ]


@dataclass(frozen=True)
class Host:
    """A simulated race drawn before it runs (``host_draws``), and the rules it is raced with:
    ``foresee_cap=False``, the allocation before the cap was foreseen (``previous_rules.never_foresee``);
    ``equal_looks=True``, the error level before the cap's share (``previous_rules.equal_looks``);
    ``larger_spread=True``, a pair's own spread whenever it is the wider (``previous_rules.LARGER_SPREAD``)."""

    draws: list[list[float]]
    foresee_cap: bool = True
    equal_looks: bool = False
    larger_spread: bool = False

    def options(self) -> LoopOptions:
        """The race's loop options for these rules (the product's by default)."""
        level = previous_rules.equal_looks if self.equal_looks else race_alpha
        own = previous_rules.LARGER_SPREAD if self.larger_spread else evidence.OWN_SPREAD_LEVEL
        if self.foresee_cap:
            return LoopOptions(level=level, own_level=own)
        return LoopOptions(foresee=previous_rules.never_foresee, level=level, own_level=own)


def new_race(
    mus: list[float],
    resources: list[tuple],
    launch_sigma: float,
    round_sigma: float,
    rng: random.Random,
    spec: RaceSpec,
    host: Host | None = None,
) -> Race:
    """The product's race (``sequential_race``, and ``confirm`` when the spec asks for confirmation rounds) on
    ``host`` (drawn from ``rng`` when not given, the cap foreseen)."""
    names = [f"c{i}" for i in range(len(mus))]
    index = {n: i for i, n in enumerate(names)}
    draws = (
        host.draws if host is not None else host_draws(mus, launch_sigma, round_sigma, rng, spec.max_rounds)
    )
    draw = _launcher(mus, launch_sigma, round_sigma, rng)

    def launch(name: str) -> float:
        return draw(index[name])

    def race_round(labels: list[str], round_index: int) -> dict[str, float]:
        return {n: draws[index[n]][round_index] for n in labels}

    def launch_round(labels: list[str], round_index: int) -> dict[str, float]:
        return {n: launch(n) for n in labels}

    race_rounds, outcome = sequential_race(
        names[:-1],
        names[-1],
        race_round,
        {n: resources[index[n]] for n in names},
        spec,
        progress=Progress.quiet(),
        options=host.options() if host is not None else LoopOptions(),
    )
    assert outcome.speedup is not None, "sequential_race states the winner's speedup over the baseline"
    ratio, launches = outcome.speedup, race_rounds.launches
    capped = max(max(m) for m in race_rounds.measured.values() if m) + 1 >= spec.max_rounds
    if outcome.winner != names[-1] and spec.confirm_rounds:
        confirmation, check = confirm(outcome.winner, names[-1], launch_round, launch, spec.confirm_rounds)
        ratio = evidence.Ratio(confirmation.speedup, confirmation.low, confirmation.high, confirmation.rounds)
        launches += check.launches
    return Race(index[outcome.winner], ratio, launches, outcome.decided, outcome.loss, capped)


def previous_race(
    mus: list[float],
    resources: list[tuple],
    launch_sigma: float,
    round_sigma: float,
    rng: random.Random,
    spec: RaceSpec = previous_rules.SPEC,
) -> Race:
    """The reference race (``previous_rules.race``), with its own confirmation rounds."""
    outcome = previous_rules.race(_launcher(mus, launch_sigma, round_sigma, rng), resources, spec)
    return Race(outcome.winner, outcome.ratio, outcome.launches, outcome.decided, None)


@dataclass(frozen=True)
class Side:
    """One procedure's figures in a cell."""

    coverage: float  # the printed 95% interval holds the true speedup
    wrong: float  # deployed >= SLOWER slower than the best, over all races
    decided: int  # races that said they decided
    wrong_decided: int  # of which deployed >= SLOWER slower
    launches: float  # mean per race (confirmation rounds and outliers launched again included)
    holds: float | None = None  # the stated loss bound is at least the true loss
    median_loss_bound: float | None = None

    @property
    def wrong_when_decided(self) -> float | None:
        return self.wrong_decided / self.decided if self.decided else None

    @property
    def minutes(self) -> float:
        return self.launches * MINUTES_PER_LAUNCH


def side(races: list[Race], mus: list[float]) -> Side:
    best = max(mus[:-1])
    bad = [mus[r.winner] <= best * (1 - SLOWER) + 1e-12 for r in races]
    truth = [mus[r.winner] / mus[-1] for r in races]
    bounds = [r.loss for r in races if r.loss is not None]
    assert len(bounds) in (0, len(races)), "a procedure states a loss bound in every race or in none"
    return Side(
        coverage=statistics.fmean(r.ratio.low <= t <= r.ratio.high for r, t in zip(races, truth)),
        wrong=statistics.fmean(bad),
        decided=sum(r.decided for r in races),
        wrong_decided=sum(r.decided and b for r, b in zip(races, bad)),
        launches=statistics.fmean(r.launches for r in races),
        holds=statistics.fmean(best / mus[r.winner] - 1 <= loss + 1e-12 for r, loss in zip(races, bounds))
        if bounds
        else None,
        median_loss_bound=statistics.median(bounds) if bounds else None,
    )


@dataclass(frozen=True)
class AtCap:
    """The product's race against its previous allocation (the cap not foreseen) on the same simulated races,
    over those the previous allocation ran to its cap: the stated loss bound's median and mean launches."""

    races: int  # races the previous allocation ran to race.max_rounds
    loss: float | None  # median stated loss bound there, the product's race (fraction)
    previous_loss: float | None  # the previous allocation's
    launches: float | None  # mean launches there, the product's race
    previous_launches: float | None
    changed: int  # races (of all) that ended differently under the two allocations
    holds: float  # the product's stated bound holds, over those races
    wrong: float  # deployed >= SLOWER slower than the best, over all races, the product's race
    previous_wrong: float


def at_cap(new: list[Race], previous: list[Race], mus: list[float]) -> AtCap:
    best = max(mus[:-1])
    pairs = [(n, p) for n, p in zip(new, previous) if p.capped]
    bounds = [(n.loss, p.loss) for n, p in pairs if n.loss is not None and p.loss is not None]
    assert len(bounds) == len(pairs), "the product's race states a loss bound in every race"
    return AtCap(
        races=len(pairs),
        loss=statistics.median(b for b, _ in bounds) if bounds else None,
        previous_loss=statistics.median(b for _, b in bounds) if bounds else None,
        launches=statistics.fmean(n.launches for n, _ in pairs) if pairs else None,
        previous_launches=statistics.fmean(p.launches for _, p in pairs) if pairs else None,
        changed=sum(n != p for n, p in zip(new, previous)),
        holds=statistics.fmean(best / mus[n.winner] - 1 <= b + 1e-12 for (n, _), (b, _) in zip(pairs, bounds))
        if bounds
        else 1.0,
        wrong=side(new, mus).wrong,
        previous_wrong=side(previous, mus).wrong,
    )


@dataclass(frozen=True)
class CapShare:
    """The product's race against the same race with the error level before the cap's share (equal shares over
    the looks: ``previous_rules.equal_looks``) on the same simulated races: the bound stated at the cap (over the
    races both ran to race.max_rounds), how often each bound held (all races), launches and wrong deployments."""

    races: int
    at_cap: int  # races both ran to race.max_rounds
    loss: float | None  # median stated loss bound at the cap, the product's race (fraction)
    before_loss: float | None  # the same races with equal shares
    holds: float  # the stated bound is at least the true loss, all races
    before_holds: float
    launches: float  # mean per race
    before_launches: float
    wrong: float  # deployed >= SLOWER slower than the best, all races
    before_wrong: float
    wrong_decided: str  # wrong / decided, "w/d"
    before_wrong_decided: str


def _true_loss(race: Race, mus: list[float]) -> float:
    return max(mus[:-1]) / mus[race.winner] - 1


def cap_share(new: list[Race], before: list[Race], fields: list[list[float]]) -> CapShare:
    """``new`` and ``before`` raced on the same draws; ``fields[i]``: race i's true rates (baseline last)."""

    def holds(races: list[Race]) -> float:
        return statistics.fmean(
            r.loss is not None and _true_loss(r, mus) <= r.loss + 1e-12 for r, mus in zip(races, fields)
        )

    def wrong(races: list[Race]) -> list[bool]:
        return [mus[r.winner] <= max(mus[:-1]) * (1 - SLOWER) + 1e-12 for r, mus in zip(races, fields)]

    def decided(races: list[Race]) -> str:
        bad = wrong(races)
        return f"{sum(r.decided and b for r, b in zip(races, bad))}/{sum(r.decided for r in races)}"

    capped = [
        (n.loss, b.loss)
        for n, b in zip(new, before)
        if n.capped and b.capped and n.loss is not None and b.loss is not None
    ]
    return CapShare(
        races=len(new),
        at_cap=len(capped),
        loss=statistics.median(n for n, _ in capped) if capped else None,
        before_loss=statistics.median(b for _, b in capped) if capped else None,
        holds=holds(new),
        before_holds=holds(before),
        launches=statistics.fmean(r.launches for r in new),
        before_launches=statistics.fmean(r.launches for r in before),
        wrong=statistics.fmean(wrong(new)),
        before_wrong=statistics.fmean(wrong(before)),
        wrong_decided=decided(new),
        before_wrong_decided=decided(before),
    )


@dataclass(frozen=True)
class RaceCell:
    launch_sigma: float
    round_sigma: float
    gap: float
    runs: int
    new: Side
    old: Side | None  # None when the reference rules were not run
    cap: AtCap | None = None  # the product's race against its previous allocation (None: not run)
    share: CapShare | None = None  # the product's race against the error level before the cap's share

    @property
    def previous(self) -> Side:
        """The reference rules' figures, in a cell where they were run."""
        assert self.old is not None, "the reference rules were not run in this cell"
        return self.old

    @property
    def new_holds(self) -> float:
        """How often the product's loss bound held (the product's race always states one)."""
        assert self.new.holds is not None, "the product's race states a loss bound in every race"
        return self.new.holds

    @property
    def launch_ratio(self) -> float:
        """Launches per race, the reference rules over the product's (modelled minutes alike: one pass per launch)."""
        return self.previous.launches / self.new.launches


def race_cell(
    launch_sigma: float,
    round_sigma: float,
    gap: float,
    runs: int,
    seed: int,
    spec: RaceSpec,
    previous: RaceSpec | None = previous_rules.SPEC,
) -> RaceCell:
    """``runs`` races of each procedure on one host and field (the reference skipped with ``previous=None``)."""
    rng = random.Random(seed)
    mus, resources = field_of(gap)
    new, allocated, before = [], [], []
    for _ in range(runs):
        draws = host_draws(mus, launch_sigma, round_sigma, rng, spec.max_rounds)
        new.append(new_race(mus, resources, launch_sigma, round_sigma, rng, spec, Host(draws)))
        allocated.append(new_race(mus, resources, launch_sigma, round_sigma, rng, spec, Host(draws, False)))
        before.append(
            new_race(mus, resources, launch_sigma, round_sigma, rng, spec, Host(draws, equal_looks=True))
        )
    old = (
        [previous_race(mus, resources, launch_sigma, round_sigma, rng, previous) for _ in range(runs)]
        if previous
        else []
    )
    return RaceCell(
        launch_sigma,
        round_sigma,
        gap,
        runs,
        side(new, mus),
        side(old, mus) if old else None,
        at_cap(new, allocated, mus),
        cap_share(new, before, [mus] * runs),
    )


# ------------------------------------------------------------------ pruning


PROMPTS = (("code", 6), ("prose", 6))
REPETITIONS = 3
REQUEST_SIGMA = 0.04


def trial_samples(launch_sigma: float, rng: random.Random, prompt_effect: dict[str, float]) -> list[dict]:
    """One equal configuration's trial: one launch, REPETITIONS passes over the prompts."""
    effect = rng.gauss(0, launch_sigma)
    return [
        {
            "prompt_id": p,
            "suite": suite,
            "repetition": rep,
            "tokens_per_second": 100 * prompt_effect[p] * math.exp(effect + rng.gauss(0, REQUEST_SIGMA)),
        }
        for rep in range(REPETITIONS)
        for suite, n in PROMPTS
        for p in (f"{suite}-{i}" for i in range(n))
    ]


def measured_launch_sigma(
    launch_sigma: float, rng: random.Random, sentinels: int = 3, rule=allowed_launch_spread
) -> float:
    """The spread a study allows after ``sentinels`` reference launches (``rule``: the bound decisions allow,
    tuner.decisions.drift.allowed_launch_spread, or the point estimate a launch is sized on)."""
    rates = [math.exp(rng.gauss(0, launch_sigma) + rng.gauss(0, REQUEST_SIGMA / 6)) for _ in range(sentinels)]
    return rule([math.log(b / a) for a, b in zip(rates, rates[1:])])


def pruned(samples: list[dict], incumbent: list[dict], rule, launch: float) -> bool:
    planned = len(samples)
    for n_seen in range(3, planned):  # never after the last request
        part = samples[:n_seen]
        if rule == "new" and should_prune(part, incumbent, "search", planned, launch_sigma=launch).prune:
            return True
        if rule == "old" and previous_rules.prune(part, incumbent, launch):
            return True
    return False


def prune_cell(launch_sigma: float, runs: int, seed: int) -> dict:
    rng = random.Random(seed)
    counts = {"new_one": 0, "old_one": 0, "new_best5": 0, "old_best5": 0, "new_prior": 0}
    for _ in range(runs):
        effect = {f"{s}-{i}": math.exp(rng.gauss(0, 0.3)) for s, n in PROMPTS for i in range(n)}
        trials = [trial_samples(launch_sigma, rng, effect) for _ in range(6)]
        launch = measured_launch_sigma(launch_sigma, rng)
        means = [statistics.fmean(math.log(s["tokens_per_second"]) for s in t) for t in trials[:5]]
        best5 = trials[max(range(5), key=lambda i: means[i])]
        candidate = trials[5]
        counts["new_one"] += pruned(candidate, trials[0], "new", launch)
        counts["old_one"] += pruned(candidate, trials[0], "old", launch)
        counts["new_best5"] += pruned(candidate, best5, "new", launch)
        counts["old_best5"] += pruned(candidate, best5, "old", launch)
        counts["new_prior"] += pruned(candidate, trials[0], "new", PRIOR_LAUNCH_SIGMA)
    return {"launch_sigma": launch_sigma, **{k: v / runs for k, v in counts.items()}}


# ------------------------------------------------------------------ finalists


def finalist_cell(launch_sigma: float, round_sigma: float, runs: int, seed: int, max_new: int) -> dict:
    """8 configurations 0-10% below the best, each recorded once (one launch, 3 passes): is the best a finalist?"""
    rng = random.Random(seed)
    mus = [1.0 - 0.1 * j / 7 for j in range(8)]
    hit_new = hit_old = 0
    for _ in range(runs):
        recorded = []
        for mu in mus:
            effect = rng.gauss(0, launch_sigma)
            passes = [mu * math.exp(effect + rng.gauss(0, round_sigma)) for _ in range(3)]
            recorded.append((statistics.median(passes), statistics.stdev(passes) / statistics.fmean(passes)))
        launch = measured_launch_sigma(launch_sigma, rng)
        new = within_reach([(math.log(r), cv) for r, cv in recorded], launch)[:max_new]
        hit_new += 0 in new
        hit_old += 0 in previous_rules.finalists(recorded)
    return {
        "launch_sigma": launch_sigma,
        "round_sigma": round_sigma,
        "new": hit_new / runs,
        "old": hit_old / runs,
    }


READINGS_SPAN = 0.25  # the pooled-readings cut's field: 8 configurations up to this share below the best
READINGS = 3  # launches each configuration was recorded in (a trial and two re-measures)


def readings_cell(launch_sigma: float, round_sigma: float, runs: int, seed: int, max_new: int) -> dict:
    """8 configurations 0-25% below the best, each recorded in ``READINGS`` launches of 3 passes: the finalists
    when a configuration is judged on its readings together (the product's ``within_reach`` with counts) against
    every reading judged on its own (``previous_rules.each_reading``): how many, and is the best one of them?"""
    rng = random.Random(seed)
    mus = [1.0 - READINGS_SPAN * j / 7 for j in range(8)]
    new_hits = old_hits = 0
    new_count = old_count = 0
    for _ in range(runs):
        readings = []
        for mu in mus:
            launches = []
            for _ in range(READINGS):
                effect = rng.gauss(0, launch_sigma)
                passes = [mu * math.exp(effect + rng.gauss(0, round_sigma)) for _ in range(3)]
                launches.append(
                    (math.log(statistics.median(passes)), statistics.stdev(passes) / statistics.fmean(passes))
                )
            readings.append(launches)
        launch = measured_launch_sigma(launch_sigma, rng)
        pooled = [
            (
                statistics.fmean(log for log, _ in r),
                math.sqrt(statistics.fmean(cv * cv for _, cv in r)),
                len(r),
            )
            for r in readings
        ]
        new = within_reach(pooled, launch)[:max_new]
        old = previous_rules.each_reading(readings, launch)[:max_new]
        new_hits += 0 in new
        old_hits += 0 in old
        new_count += len(new)
        old_count += len(old)
    return {
        "launch_sigma": launch_sigma,
        "round_sigma": round_sigma,
        "new": new_hits / runs,
        "old": old_hits / runs,
        "new_finalists": new_count / runs,
        "old_finalists": old_count / runs,
    }


# ------------------------------------------------------------------ the 32B-scale stand-in

# The 32B-scale stand-in: nine finalists within 7% at a 5% launch spread, the baseline far behind; the bar there
# (STAND_IN_BAR): a median stated loss at the cap of at most 5% within 45 launches, the bound holding in 95%.
STAND_IN = [1.0 - 0.07 * i / 8 for i in range(9)] + [0.6]
STAND_IN_LAUNCH = 0.05
DRAWN_SPAN = 0.10  # a drawn stand-in's eight other finalists lie uniformly within this share below the best
DEVELOPMENT_SEEDS = range(0, 200)  # the cap's share and the spread test were developed on these (the field)
HELD_OUT_SEEDS = range(10_000, 10_200)  # fixed before it was judged: the same field, and drawn fields
NOISIER = 0.15  # the noisier-finalist check: one finalist of each drawn field launches with this spread
STAND_IN_BAR = {"loss": 0.05, "launches": 45.0, "holds": 0.95}
TOLD_BUDGETS = (45, 50, 60)  # the bar's launches, about the race's, and more (``race_told_the_truth``)


def drawn_stand_in(rng: random.Random) -> list[float]:
    """A held-out stand-in: the best, eight finalists uniformly within ``DRAWN_SPAN`` below it, the baseline at
    60%."""
    return [1.0, *sorted((1 - rng.uniform(0, DRAWN_SPAN) for _ in range(8)), reverse=True), 0.6]


def noisier_spreads(mus: list[float]) -> list[float]:
    """The stand-in's launch spread for every configuration but the second finalist's, ``NOISIER``: a configuration
    whose launches spread more than the others' (the case a pair's own spread is tested for)."""
    return [NOISIER if i == 1 else STAND_IN_LAUNCH for i in range(len(mus))]


def stand_in_cell(name: str, seeds: range, drawn: bool, spec: RaceSpec, noisier: bool = False) -> dict:
    """The product's race and the same race with a pair's own spread whenever it is the wider (the rule before the
    spread test), on the same draws, one race per seed: the stand-in's field, or with ``drawn`` a field drawn from
    each seed, and with ``noisier`` one finalist launching with a wider spread (``noisier_spreads``)."""
    new, before, fields = [], [], []
    for seed in seeds:
        rng = random.Random(seed)
        mus = drawn_stand_in(rng) if drawn else STAND_IN
        resources = [(1, 1)] * (len(mus) - 1) + [(1, 0)]
        spreads = noisier_spreads(mus) if noisier else STAND_IN_LAUNCH
        draws = host_draws(mus, spreads, 0.0, rng, spec.max_rounds)
        new.append(new_race(mus, resources, STAND_IN_LAUNCH, 0.0, rng, spec, Host(draws)))
        before.append(
            new_race(mus, resources, STAND_IN_LAUNCH, 0.0, rng, spec, Host(draws, larger_spread=True))
        )
        fields.append(mus)
    return {
        "name": name,
        "seeds": f"{seeds.start}-{seeds.stop - 1}",
        **asdict(cap_share(new, before, fields)),
    }


def stand_in_cells(runs: int, spec: RaceSpec) -> list[dict]:
    """The stand-in on its development seeds and on the held-out ones (its field, and drawn fields), at most
    ``runs`` races each."""
    dev, held = DEVELOPMENT_SEEDS, HELD_OUT_SEEDS
    dev = range(dev.start, dev.start + min(runs, len(dev)))
    held = range(held.start, held.start + min(runs, len(held)))
    return [
        stand_in_cell("stand-in, development seeds", dev, False, spec),
        stand_in_cell("stand-in, held-out seeds", held, False, spec),
        stand_in_cell(
            f"drawn stand-ins (eight within {DRAWN_SPAN:.0%} of the best), held-out seeds", held, True, spec
        ),
        stand_in_cell(
            f"drawn stand-ins, the second finalist at a {NOISIER:.0%} launch spread, held-out seeds",
            held,
            True,
            spec,
            noisier=True,
        ),
    ]


# ------------------------------------------------------------------ the section


def round_budget_cells(runs: int, seed: int, spec: RaceSpec, previous: bool = True) -> list[dict]:
    """Both races at the default host and a 3% gap with larger ``race.max_rounds``: wrong deployments (all races)
    against launches, so launches at equal error can be read off. Why: the bar on a wrong deployment is a trade
    against race time, and the product owner needs the curve, not one point."""
    cells = []
    for index, rounds in enumerate(ROUND_BUDGETS):
        new_spec = RaceSpec(**(asdict(spec) | {"max_rounds": rounds}))
        old_spec = RaceSpec(**(asdict(previous_rules.SPEC) | {"max_rounds": rounds}))
        cell = race_cell(*DEFAULT_HOST, SLOWER, runs, seed + index, new_spec, old_spec if previous else None)
        cells.append(
            {
                "max_rounds": rounds,
                "new": asdict(cell.new),
                "old": asdict(cell.previous) if previous else None,
            }
        )
    return cells


def grid() -> list[tuple[float, float, float]]:
    return [(ls, rs, gap) for ls in LAUNCH_SPREADS for rs in ROUND_SPREADS for gap in GAPS]


def measure_decisions(
    runs: int = 400, seed: int = 0, spec: RaceSpec = RaceSpec(), budgets: bool = True
) -> dict:
    """Every table of the decision benchmark; ``budgets=False`` skips the round-budget curve (a quick run)."""
    races = [
        race_cell(ls, rs, gap, runs * (DEFAULT_HOST_RUNS if (ls, rs) == DEFAULT_HOST else 1), seed + i, spec)
        for i, (ls, rs, gap) in enumerate(grid())
    ]
    prunes = [prune_cell(ls, runs, seed + 100 + i) for i, ls in enumerate(LAUNCH_SPREADS)]
    cuts = [
        finalist_cell(ls, rs, runs, seed + 200 + i, spec.max_finalists)
        for i, (ls, rs) in enumerate((ls, rs) for ls in LAUNCH_SPREADS for rs in ROUND_SPREADS)
    ]
    return {
        "runs": runs,
        "spec": asdict(spec),
        "races": [asdict(c) for c in races],
        "pruning": prunes,
        "finalists": cuts,
        "round_budgets": round_budget_cells(runs, seed + 300, spec) if budgets else [],
        "stand_in": stand_in_cells(runs, spec),
        "told_the_truth": race_told_the_truth.told_the_truth_figures(
            STAND_IN[:-1], STAND_IN_LAUNCH, TOLD_BUDGETS
        ),
        "withdrawn": race_told_the_truth.withdrawn(STAND_IN[:-1], STAND_IN_LAUNCH, TOLD_BUDGETS[:2]),
        "readings": [
            readings_cell(ls, rs, runs, seed + 400 + i, spec.max_finalists)
            for i, (ls, rs) in enumerate((ls, rs) for ls in LAUNCH_SPREADS for rs in ROUND_SPREADS)
        ],
        "verdicts": verdicts(races, prunes, cuts),
    }


def _worst_decided(races: list[RaceCell]) -> tuple[float, RaceCell | None]:
    """The highest wrong-when-decided rate over the cells with at least ENOUGH_DECIDED decided races."""
    judged = [c for c in races if c.new.decided >= ENOUGH_DECIDED]
    worst = max(judged, key=_wrong_when_decided, default=None)
    return (_wrong_when_decided(worst) if worst else 0.0), worst


def _wrong_when_decided(cell: RaceCell) -> float:
    rate = cell.new.wrong_when_decided
    assert rate is not None, "a judged cell has decided races"
    return rate


def verdicts(races: list[RaceCell], prunes: list[dict], cuts: list[dict]) -> dict:
    """Each target over every cell of its grid; the launches at the default host (previous over new), where the
    product's race must deploy wrongly no more often than the reference race does."""
    at_default = [c for c in races if (c.launch_sigma, c.round_sigma) == DEFAULT_HOST]
    worst, cell = _worst_decided(races)
    at_cap_cells = [c.cap for c in races if c.cap is not None and c.cap.races]
    capped = [c for c in at_cap_cells if c.races >= ENOUGH_DECIDED]  # a median of a few races is not judged
    figures = {
        "holds": min(c.new_holds for c in races),
        "wrong": worst,
        "coverage": min(c.new.coverage for c in races),
        "pruned": max(p["new_one"] for p in prunes),
        "finalist": min(c["new"] for c in cuts),
        "launches": min(c.launch_ratio for c in at_default),
        "cap": max((_cap_ratio(c) for c in capped), default=1.0),
    }
    few = [c for c in races if c.new.decided < ENOUGH_DECIDED]
    pooled = (
        f"; the {len(few)} cells with fewer decided races, pooled: {sum(c.new.wrong_decided for c in few)} of "
        f"{sum(c.new.decided for c in few)}"
        if few
        else ""
    )
    notes = {
        "wrong": (
            f"{cell.new.wrong_decided} of {cell.new.decided} decided races (launch {cell.launch_sigma:.0%}, "
            f"round {cell.round_sigma:.0%}, gap {cell.gap:.0%})"
            if cell
            else "no cell has enough decided races"
        )
        + pooled,
        "cap": f"{len(capped)} cells with {ENOUGH_DECIDED}+ races at the cap{_unjudged_caps(races)}; launches "
        f"there, the product's race over the previous allocation: at most "
        f"{max((_cap_launch_ratio(c) for c in capped), default=1.0):.3f}x; the bound holds there in at least "
        f"{100 * min((c.holds for c in capped), default=1.0):.1f}% of races",
        "launches": "deployed >= 3% slower, new / previous: "
        + ", ".join(f"gap {c.gap:.0%}: {c.new.wrong:.1%} / {c.previous.wrong:.1%}" for c in at_default),
    }
    out = {}
    for name, figure in figures.items():
        met = (
            figure >= TARGETS[name]
            if name in ("holds", "coverage", "finalist", "launches")
            else figure <= TARGETS[name]
        )
        if (
            name == "launches"
        ):  # at equal or lower error: no gap where the new race deploys wrongly more often
            met = met and all(c.new.wrong <= c.previous.wrong + _two_se(c) for c in at_default)
        if name == "cap":  # and at equal or fewer launches, the bound holding in 95% of those races
            met = met and all(_cap_launch_ratio(c) <= 1 and c.holds >= TARGETS["holds"] for c in capped)
        if name == "wrong" and cell is None:
            met = None  # nothing to judge on: say so rather than "met"
        out[name] = {"figure": figure, "target": TARGETS[name], "met": met, "note": notes.get(name, "")}
    return out


def _unjudged_caps(races: list[RaceCell]) -> str:
    """The cells with races at the cap but fewer than ``ENOUGH_DECIDED``: printed, not judged."""
    few = [c for c in races if c.cap is not None and 0 < c.cap.races < ENOUGH_DECIDED]
    return "".join(
        f"; not judged: launch {c.launch_sigma:.0%}, round {c.round_sigma:.0%}, gap {c.gap:.0%}, {c.cap.races} "
        f"races at the cap ({100 * (c.cap.loss or 0):.1f}% / {100 * (c.cap.previous_loss or 0):.1f}%)"
        for c in few
        if c.cap is not None
    )


def _cap_ratio(cap: AtCap) -> float:
    """The product's median stated loss at the cap over the previous allocation's (1: no wider)."""
    assert cap.loss is not None and cap.previous_loss is not None, "a cell with races at the cap has bounds"
    return cap.loss / cap.previous_loss if cap.previous_loss > 0 else 1.0


def _cap_launch_ratio(cap: AtCap) -> float:
    assert cap.launches is not None and cap.previous_launches is not None, "a cell with races at the cap"
    return cap.launches / cap.previous_launches


def _two_se(cell: RaceCell) -> float:
    """Two standard errors of the difference of two wrong-deployment rates over ``cell.runs`` races each."""
    pooled = (cell.new.wrong + cell.previous.wrong) / 2
    return 2 * math.sqrt(2 * pooled * (1 - pooled) / cell.runs)


def _pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.0f}%"


def _decided(side_figures: dict) -> str:
    wrong = side_figures["wrong_decided"] / side_figures["decided"] if side_figures["decided"] else None
    return f"{side_figures['wrong_decided']}/{side_figures['decided']} ({_pct(wrong)})"


def _launches(new: dict, old: dict) -> str:
    """Launches per race, new / previous, and their modelled minutes."""
    return (
        f"{new['launches']:.1f} / {old['launches']:.1f} "
        f"({new['launches'] * MINUTES_PER_LAUNCH:.0f} / {old['launches'] * MINUTES_PER_LAUNCH:.0f})"
    )


def race_table(result: dict) -> list[str]:
    header = (
        "launch spread",
        "round spread",
        "gap",
        "loss bound holds (median bound)",
        "deployed >= 3% slower, new / previous",
        "wrong / decided, new / previous",
        "coverage of the printed 95% interval, new / previous",
        "launches per race, new / previous (modelled min)",
    )
    rows = (
        (
            _pct(c["launch_sigma"]),
            _pct(c["round_sigma"]),
            _pct(c["gap"]),
            f"{100 * c['new']['holds']:.1f}% ({100 * c['new']['median_loss_bound']:.1f}%)",
            f"{_pct(c['new']['wrong'])} / {_pct(c['old']['wrong'])}",
            f"{_decided(c['new'])} / {_decided(c['old'])}",
            f"{_pct(c['new']['coverage'])} / {_pct(c['old']['coverage'])}",
            _launches(c["new"], c["old"]),
        )
        for c in result["races"]
    )
    return markdown_table(header, rows)


def _cap_lines(result: dict) -> list[str]:
    """The product's race against its previous allocation on the same simulated races (the same rate for the same
    configuration in the same round), over the races the previous allocation ran to race.max_rounds."""

    def both(new: float | None, old: float | None, spec: str = ".1%") -> str:
        return "-" if new is None or old is None else f"{new:{spec}} / {old:{spec}}"

    rows = []
    for c in result["races"]:
        cap = c.get("cap")
        if cap is None:
            continue
        rows.append(
            (
                _pct(c["launch_sigma"]),
                _pct(c["round_sigma"]),
                _pct(c["gap"]),
                f"{cap['races']} of {c['runs']} ({cap['changed']} ended differently)",
                both(cap["loss"], cap["previous_loss"]),
                both(cap["launches"], cap["previous_launches"], ".1f"),
                f"{100 * cap['holds']:.1f}%",
                both(cap["wrong"], cap["previous_wrong"]),
            )
        )
    return [
        "At the cap: the product's race against its previous allocation (before the cap was foreseen, its last "
        "rounds went to the leader, the runner-up and the finalist with the largest bound at the pooled spread) "
        "on the same simulated races, over the races the previous allocation ran to race.max_rounds:",
        "",
        *markdown_table(
            (
                "launch spread",
                "round spread",
                "gap",
                "races at the cap",
                "median stated loss at the cap, new / previous allocation",
                "launches there, new / previous allocation",
                "bound holds there (new)",
                "deployed >= 3% slower (all races), new / previous allocation",
            ),
            rows,
        ),
    ]


def _share_row(share: dict) -> tuple[str, ...]:
    """One row of the cap's share against equal shares: at the cap, held, wrong, decided, launches."""

    def both(new: float | None, old: float | None, spec: str = ".1%") -> str:
        return "-" if new is None or old is None else f"{new:{spec}} / {old:{spec}}"

    return (
        f"{share['at_cap']} of {share['races']}",
        both(share["loss"], share["before_loss"]),
        both(share["holds"], share["before_holds"]),
        both(share["wrong"], share["before_wrong"]),
        f"{share['wrong_decided']} / {share['before_wrong_decided']}",
        both(share["launches"], share["before_launches"], ".1f"),
    )


SHARE_HEADER = (
    "races both ran to the cap",
    "median stated loss at the cap, new / before",
    "loss bound holds (all races), new / before",
    "deployed >= 3% slower, new / before",
    "wrong / decided, new / before",
    "launches per race, new / before",
)


def _share_lines(result: dict) -> list[str]:
    """The product's race (half the error level at the cap's look) against the same race with the level in equal
    shares over its looks (before), on the same simulated races: the grid, then the 32B-scale stand-in."""
    grid_rows = [
        (_pct(c["launch_sigma"]), _pct(c["round_sigma"]), _pct(c["gap"]), *_share_row(c["share"]))
        for c in result["races"]
        if c.get("share")
    ]
    lines = [
        "The cap's share of the error level: the product's race (half of the 5% at the look at race.max_rounds, the "
        "rest in equal shares over the looks before it) against the same race with equal shares over every look "
        "(before, `previous_rules.equal_looks`), on the same simulated races:",
        "",
        *markdown_table(("launch spread", "round spread", "gap", *SHARE_HEADER), grid_rows),
    ]
    if not result.get("stand_in"):
        return lines
    bar = STAND_IN_BAR
    lines += [
        "",
        f"The 32B-scale stand-in (nine finalists from 100% down to 93%, {STAND_IN_LAUNCH:.0%} launch spread, no "
        "round spread, the baseline at 60%; one race per seed), and drawn stand-ins: the product's race against the "
        "same race with a pair's own spread whenever it is the wider (before, `previous_rules.LARGER_SPREAD`), on the "
        "same draws; the last row launches one finalist at a wider spread than the others. The bar "
        f"(issue 58): the median stated loss at the cap at most {bar['loss']:.0%} within {bar['launches']:.0f} "
        f"launches, the bound holding in {bar['holds']:.0%} of races:",
        "",
        *markdown_table(
            ("stand-in", "seeds", *SHARE_HEADER, "bar"),
            (
                (c["name"], c["seeds"], *_share_row(c), "met" if _stand_in_met(c) else "MISSED")
                for c in result["stand_in"]
            ),
        ),
        *race_told_the_truth.told_the_truth_lines(
            result.get("told_the_truth", []),
            result.get("withdrawn", []),
            len(STAND_IN) - 1,
            STAND_IN_LAUNCH,
            bar["loss"],
        ),
    ]
    return lines


def _stand_in_met(cell: dict) -> bool:
    bar = STAND_IN_BAR
    return (
        cell["loss"] is not None
        and cell["loss"] <= bar["loss"]
        and cell["launches"] <= bar["launches"]
        and cell["holds"] >= bar["holds"]
    )


def markdown(result: dict) -> str:
    pct = _pct
    spec = result["spec"]
    lines = [
        f"Simulated host, {result['runs']} races per cell ({DEFAULT_HOST_RUNS * result['runs']} at the default "
        f"host, {pct(DEFAULT_HOST[0])} launch and {pct(DEFAULT_HOST[1])} round spread); the product's race "
        f"(race.loss {spec['loss']:.0%}, {spec['min_rounds']}-{spec['max_rounds']} rounds) against the previous "
        f"rules (every finalist every round, the leader tested as if named in advance, 4 confirmation "
        f"rounds). Finalists: the best, one "
        f"GAP slower with fewer threads, two at 92% and 88%, the baseline at 60%; {pct(OUTLIER_P)} of launches are "
        f"outliers at a tenth of the rate. Modelled minutes: {MINUTES_PER_LAUNCH} min per launch (a 32B-scale "
        f"host: load, warm-up, one pass). The previous rules state no loss bound.",
        "",
        *race_table(result),
        "",
        *_cap_lines(result),
        "",
        *_share_lines(result),
        "",
        "Pruning an equal configuration (12 prompts x 3 passes, one launch each; the launch spread as three "
        "sentinels measure it), new / old:",
        "",
        "| launch spread | against one equal trial | against the best of 5 equal trials | new, before 3 sentinels "
        "(prior 5%) |",
        "|---|---|---|---|",
    ]
    for prune in result["pruning"]:
        lines.append(
            f"| {pct(prune['launch_sigma'])} | {pct(prune['new_one'])} / {pct(prune['old_one'])} | "
            f"{pct(prune['new_best5'])} / {pct(prune['old_best5'])} | {pct(prune['new_prior'])} |"
        )
    lines += [
        "",
        "The true best among the finalists (8 configurations within 10%, each recorded in one launch), "
        "new / old:",
        "",
        "| launch spread | round spread | true best a finalist |",
        "|---|---|---|",
    ]
    for cut in result["finalists"]:
        lines.append(
            f"| {pct(cut['launch_sigma'])} | {pct(cut['round_sigma'])} | {pct(cut['new'])} / {pct(cut['old'])} |"
        )
    lines += _readings_lines(result)
    lines += _target_lines(result) + _round_budget_lines(result)
    return "\n".join(lines) + "\n"


def _readings_lines(result: dict) -> list[str]:
    """The finalist cut on a configuration's readings together against each reading on its own."""
    if not result.get("readings"):
        return []
    return [
        "",
        f"A configuration recorded in {READINGS} launches (8 configurations 0-{READINGS_SPAN:.0%} below the best): "
        "judged on its readings together against each reading on its own (the cut before), new / before:",
        "",
        *markdown_table(
            ("launch spread", "round spread", "true best a finalist", "finalists per race"),
            (
                (
                    _pct(c["launch_sigma"]),
                    _pct(c["round_sigma"]),
                    f"{_pct(c['new'])} / {_pct(c['old'])}",
                    f"{c['new_finalists']:.1f} / {c['old_finalists']:.1f}",
                )
                for c in result["readings"]
            ),
        ),
    ]


def _target_lines(result: dict) -> list[str]:
    """Each bar over every cell of its grid: the figure and whether it was met."""
    pct = _pct
    lines = ["", "Targets, over every cell of each grid:"]
    names = {
        "holds": "the loss bound holds >=",
        "wrong": f"wrong deployment when the race says it decided (cells with {ENOUGH_DECIDED}+ decided races) <=",
        "coverage": "coverage >=",
        "pruned": "equal configuration pruned (against one equal trial) <=",
        "finalist": "true best a finalist >=",
        "launches": "launches per race at the default host, previous over new, at equal or lower error >=",
        "cap": f"median stated loss at the cap, over the previous allocation's on the same races, at equal or "
        f"fewer launches, in every cell with {ENOUGH_DECIDED}+ races at the cap <=",
    }
    for name, entry in result["verdicts"].items():
        ratio = name in ("launches", "cap")
        figure = f"{entry['figure']:.3f}x" if ratio else f"{100 * entry['figure']:.1f}%"
        target = f"{entry['target']:.1f}x" if ratio else pct(entry["target"])
        note = f" ({entry['note']})" if entry.get("note") else ""
        verdict = "not judged" if entry["met"] is None else "met" if entry["met"] else "MISSED"
        lines.append(f"- {names[name]} {target}: {figure}{note}: {verdict}")
    return lines


def _round_budget_lines(result: dict) -> list[str]:
    """Launches at equal error: both races with a larger race.max_rounds, new / previous."""
    pct = _pct
    if not result["round_budgets"]:
        return []
    lines = [
        "",
        f"Launches at equal error: both races at the default host and a {pct(SLOWER)} gap with a larger "
        "race.max_rounds (all races, undecided ones included), new / previous:",
        "",
        *markdown_table(
            (
                "race.max_rounds",
                "deployed >= 3% slower",
                "wrong / decided",
                "launches per race (modelled min)",
                "median loss bound (new)",
            ),
            (
                (
                    str(c["max_rounds"]),
                    f"{pct(c['new']['wrong'])} / {pct(c['old']['wrong'])}",
                    f"{_decided(c['new'])} / {_decided(c['old'])}",
                    _launches(c["new"], c["old"]),
                    f"{100 * c['new']['median_loss_bound']:.1f}%",
                )
                for c in result["round_budgets"]
            ),
        ),
    ]
    return lines
