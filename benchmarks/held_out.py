"""The default search judged on drawn landscapes (``benchmarks/landscape_draws``): hosts no rule was developed on.

Why: the named landscapes are where the rules were developed, so they stay as regression checks; whether a rule
holds on the next host is judged here, on draws from a fixed held-out seed range (``HELD_OUT_SEEDS``), with the
development range (``DEVELOPMENT_SEEDS``) for inspecting why a search stalls. Each draw is replayed by the default
(``operator_replay.replay``, without pruning) over ``seeds`` seeds and scored as the named landscapes are
(``operator_replay.scores``). The figures, pooled over every draw and seed: the median trials to the tolerance
(a miss counts as infinite), the share of draws where every seed is within it by ``budget`` trials, and the 90th
percentile of the regret after 20 and after 40 trials. The bars: ``MEDIAN_BAR``, ``SHARE_BAR``, ``P90_BAR``
(docs/decisions.md, "Held-out draws").

A rule is judged against the run before it (``paired``): each replay (draw and seed) with its own before, sooner or
later within the tolerance, and a sign test on those that differ. Both read every configuration they both measure
alike (``operator_replay.Objective.reading_noise``), so what differs is where the rule sent the search. Why: pooled
figures of two runs moved by 4 to 7 seeds of 200 where the paired counts were even, and a rule chosen on such a move
was slower on the held-out draws (docs/evidence/held-out-draws.md, "Tried, not taken: the baseline's policy at the
rung").

Beside the figures, the same draws replayed once each with exact readings (``DrawPlan.exact``: no launch or request
noise, so every seed replays alike): what the order of the stages costs by itself. The gap between the two is what
the noise costs. Why: on development draws 0-99 the default with exact readings came within 3% by 40 trials in 97%
of draws but needed a median of 16.5 trials (docs/evidence/held-out-draws.md, "Exact readings"), so a bar on the
median asks the stages for fewer trials, not rules against the noise.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TypedDict

import numpy as np
from joblib import Parallel, delayed

from benchmarks.landscape_draws import HELD_OUT_SEEDS, draw
from benchmarks.landscape_simulation import OperatorLandscape
from benchmarks.operator_replay import TOLERANCE, TrialLog, replay, scores
from tuner.storage.records import config_from_dict

REGRET_AT = (20, 40)
MEDIAN_BAR, SHARE_BAR, P90_BAR = (
    10,
    0.95,
    0.02,
)  # median trials to 3%; draws with every seed by 40; p90 regret at 40
SHOWN = 10  # the worst draws listed under the figures
# The knob groups a missed replay is read against (``lacks``): each set to the optimum's, the others as found.
KNOB_GROUPS = {
    "threads": ("threads", "threads_batch"),
    "NUMA policy": ("numa", "numa_node"),
    "NUMA policy with threads": ("numa", "numa_node", "threads", "threads_batch"),
    "temperature": ("temperature",),
    "K": ("draft_max",),
    "speculation": (
        "spec_type",
        "draft",
        "ngram_key",
        "ngram_min_hits",
        "lookup",
        "lookup_max",
        "lookup_min",
    ),
}
NO_ONE_GROUP = "no one group"
# the stage label of NUMA policy, thread and prompt-thread trials (``tuner.search.stages.hardware``, ``prompt_threads``)
HARDWARE_STAGE = "hardware"


@dataclass(frozen=True)
class DrawPlan:
    """Which draws (seeds of ``landscape_draws.draw``), how many replays of each (``seeds``), their trials."""

    draws: range = HELD_OUT_SEEDS
    seeds: int = 5
    budget: int = 40
    tolerance: float = TOLERANCE
    jobs: int = 1
    regret_at: tuple[int, ...] = field(default=REGRET_AT)
    exact: bool = False  # readings without launch or request noise (``exact_readings``)

    @property
    def checkpoints(self) -> tuple[int, ...]:
        """The regret checkpoints within the budget, and the budget itself (a shorter replay's last trial)."""
        return tuple(sorted({n for n in self.regret_at if n <= self.budget} | {self.budget}))


class DrawReplays(TypedDict):
    """One draw: what it is, and each seed's trials to the tolerance and regret at the checkpoints."""

    draw: int
    description: str
    optimum: float
    best_config: dict
    trials: list[int | None]
    regret: dict[int, list[float]]  # checkpoint -> per seed
    lacks: list[str | None]  # per seed: ``lacks`` if it missed; None if not, or held out
    spans: list[list[int] | None]  # per seed: ``hardware_span``


class DrawFigures(TypedDict):
    median_trials: float | None  # None when more than half the replays missed
    all_seeds_share: float  # draws where every seed reached the tolerance by the budget
    p90_regret: dict[int, float]  # checkpoint -> 90th percentile over every replay
    met: bool


class PairedComparison(TypedDict):
    """One run's replays against the same replays of a run before it."""

    replays: int
    sooner: int  # within the tolerance in fewer trials (or only now)
    later: int  # in more trials (or never now)
    within_before: int  # replays within the tolerance by the budget
    within_after: int
    p_value: float  # two-sided sign test on the replays that differ: chance of a split this uneven or more


class DrawRun(TypedDict):
    draws: list[int]  # first and last seed
    seeds: int
    budget: int
    tolerance: float
    replays: list[DrawReplays]
    figures: DrawFigures


class DrawBenchmark(DrawRun, total=False):
    # the same draws with exact readings, one replay each (absent in runs written before it was kept)
    exact: DrawFigures


def replay_draw(seed: int, plan: DrawPlan) -> DrawReplays:
    """The default on the draw of ``seed``, once per replay seed."""
    land = exact_readings(draw(seed)) if plan.exact else draw(seed)
    logs = [replay(land, "default", s, plan.budget, False) for s in range(plan.seeds)]
    runs = [scores(land, log, plan.tolerance) for log in logs]
    return {
        "draw": seed,
        "description": land.description,
        "optimum": land.optimum[0],
        "best_config": land.optimum[1].as_dict(),
        "trials": [r["trials"] for r in runs],
        "regret": {n: [r["curve"][min(n, len(r["curve"])) - 1] for r in runs] for n in plan.checkpoints},
        "lacks": [
            None if r["trials"] or seed in HELD_OUT_SEEDS else lacks(land, log, plan.tolerance)
            for r, log in zip(runs, logs)
        ],
        "spans": [hardware_span(log) for log in logs],
    }


def exact_readings(land: OperatorLandscape) -> OperatorLandscape:
    """The landscape with every launch and request reading its true rate: a replay then differs from another seed's
    only where the search itself draws at random (the structured sampler does not)."""
    return replace(land, cv_launch=0.0, cv_request=0.0)


def hardware_span(log: list[TrialLog]) -> list[int] | None:
    """The trials before the hardware stage first proposes (the baseline, a probe per draft and lookup, the best
    K) and its trials until it first hands over; None where it never proposed.
    Why: the median bar is read against it (``span_lines``): a trial count these stages already exceed in most
    replays is not reached by rules that spend the trials after them."""
    stages = [entry.stage for entry in log]
    if HARDWARE_STAGE not in stages:
        return None
    start = stages.index(HARDWARE_STAGE)
    end = next((i for i in range(start, len(stages)) if stages[i] != HARDWARE_STAGE), len(stages))
    return [start, end - start]


def lacks(land: OperatorLandscape, log: list[TrialLog], tolerance: float) -> str:
    """What a replay that missed lacks: of ``KNOB_GROUPS``, the one that, set to the optimum's in the best
    configuration it tried (the others as found), brings that configuration within the tolerance of the optimum,
    the one of fewest knobs where several do (then the one gaining most); ``NO_ONE_GROUP`` where none does (two or
    more knobs are off at once).
    Why: a rule is written for what the misses lack; reading it from traces one seed at a time took a script each
    session (docs/evidence/held-out-draws.md). Read on development draws only: the held-out ones are judged, not
    inspected."""
    best_rate, optimum = land.optimum
    found = config_from_dict(max(log, key=lambda entry: entry.true_rate).config)
    rates = {
        name: land.true_rate(replace(found, **{k: getattr(optimum, k) for k in group}))
        for name, group in KNOB_GROUPS.items()
    }
    enough = [name for name, rate in rates.items() if rate >= (1 - tolerance) * best_rate]
    return min(enough, key=lambda name: (len(KNOB_GROUPS[name]), -rates[name]), default=NO_ONE_GROUP)


def figures(replays: list[DrawReplays], plan: DrawPlan) -> DrawFigures:
    """The pooled figures against the bars."""
    trials = [math.inf if t is None else t for d in replays for t in d["trials"]]
    median = float(np.median(trials))
    share = float(np.mean([all(t is not None and t <= plan.budget for t in d["trials"]) for d in replays]))
    p90 = {
        n: float(np.percentile([r for d in replays for r in d["regret"][n]], 90)) for n in plan.checkpoints
    }
    return {
        "median_trials": None if math.isinf(median) else median,
        "all_seeds_share": share,
        "p90_regret": p90,
        "met": not math.isinf(median)
        and median <= MEDIAN_BAR
        and share >= SHARE_BAR
        and p90.get(40, math.inf) <= P90_BAR,
    }


def benchmark(plan: DrawPlan = DrawPlan()) -> DrawBenchmark:
    """Every draw of the plan replayed (``jobs`` draws at once), and the figures; then each draw once with exact
    readings, and their figures."""
    run = Parallel(n_jobs=plan.jobs)
    replays = run(delayed(replay_draw)(seed, plan) for seed in plan.draws)
    exact = replace(plan, seeds=1, exact=True)
    return {
        "draws": [plan.draws[0], plan.draws[-1]],
        "seeds": plan.seeds,
        "budget": plan.budget,
        "tolerance": plan.tolerance,
        "replays": replays,
        "figures": figures(replays, plan),
        "exact": figures(run(delayed(replay_draw)(seed, exact) for seed in plan.draws), exact),
    }


def paired(before: DrawBenchmark, after: DrawBenchmark) -> PairedComparison:
    """Each replay of ``after`` against the same draw and seed of ``before`` (the same draws, seeds, budget and
    tolerance, or ValueError): how many came within the tolerance sooner and later, and the sign test's p-value.
    Under no difference a sooner and a later replay are equally likely, so at a 5% level the test calls a rule
    that changes nothing better or worse in at most 5% of comparisons (replays of one draw share its host, so
    read it as a test over replays of these draws, not over hosts)."""
    check_comparable(before, planned(after["draws"], after["seeds"], after["budget"], after["tolerance"]))

    def rank(trials: int | None) -> float:
        return math.inf if trials is None else trials

    pairs = [
        (rank(was), rank(now))
        for old, new in zip(before["replays"], after["replays"], strict=True)
        for was, now in zip(old["trials"], new["trials"], strict=True)
    ]
    sooner, later = sum(now < was for was, now in pairs), sum(now > was for was, now in pairs)
    budget = after["budget"]
    return {
        "replays": len(pairs),
        "sooner": sooner,
        "later": later,
        "within_before": sum(was <= budget for was, _ in pairs),
        "within_after": sum(now <= budget for _, now in pairs),
        "p_value": sign_test(sooner, later),
    }


def planned(draws, seeds: int, budget: int, tolerance: float) -> str:
    """What a run replays, in words: two runs are paired only where these match."""
    return f"draws {draws[0]}-{draws[-1]}, {seeds} seeds, {budget} trials, tolerance {tolerance:g}"


def check_comparable(before: DrawBenchmark, plan: str) -> None:
    """ValueError where ``before`` replayed other draws, seeds, trials or tolerance than ``plan`` (``planned``)."""
    theirs = planned(before["draws"], before["seeds"], before["budget"], before["tolerance"])
    if theirs != plan:
        raise ValueError(f"it replayed {theirs}; this run {plan}")


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test: the chance, with each of ``wins + losses`` equally likely either way, of a split
    at least this uneven."""
    total, fewer = wins + losses, min(wins, losses)
    if total == 0:
        return 1.0
    tail = sum(math.comb(total, split) for split in range(fewer + 1)) / 2**total
    return min(1.0, 2 * tail)


def paired_markdown(result: PairedComparison, against: str) -> str:
    """The paired comparison as a paragraph under the figures."""
    same = result["replays"] - result["sooner"] - result["later"]
    verdict = (
        "no difference shown at the 5% level"
        if result["p_value"] >= 0.05
        else ("sooner" if result["sooner"] > result["later"] else "later")
        + " more often than chance explains"
    )
    return (
        f"Against {against}, replay by replay (the same draws and seeds): sooner within the tolerance (or only now) "
        f"{result['sooner']}, later (or never now) {result['later']}, the same {same}; a sign test on the "
        f"{result['sooner'] + result['later']} that differ: p = {result['p_value']:.3g}, {verdict}. Replays within "
        f"the tolerance by the budget: {result['within_before']} -> {result['within_after']} of {result['replays']}.\n"
    )


def _worst_first(replays: DrawReplays) -> tuple[int, float]:
    misses = sum(t is None for t in replays["trials"])
    return -misses, -_end_regret(replays)


def _end_regret(replays: DrawReplays) -> float:
    """The worst seed's regret at the last checkpoint."""
    return max(replays["regret"][max(replays["regret"])])


def markdown(result: DrawBenchmark) -> str:
    """The figures against the bars, then the draws where a seed missed (worst first)."""
    figs, tol = result["figures"], f"{result['tolerance']:.0%}"
    first, last = result["draws"]
    count, budget = len(result["replays"]), result["budget"]
    median = "missed" if figs["median_trials"] is None else f"{figs['median_trials']:g}"
    yes = lambda ok: "yes" if ok else "NO"  # noqa: E731
    lines = [
        f"The default on {count} drawn landscapes (draws {first}-{last}), {result['seeds']} seeds each, "
        f"{budget} trials, no pruning (`benchmarks/landscape_draws`).",
        "",
        "| figure | value | bar | met |",
        "|---|---|---|---|",
        f"| median trials to {tol} | {median} | <= {MEDIAN_BAR} | "
        f"{yes(figs['median_trials'] is not None and figs['median_trials'] <= MEDIAN_BAR)} |",
        f"| draws with every seed within {tol} by {budget} trials | {figs['all_seeds_share']:.0%} | "
        f">= {SHARE_BAR:.0%} | {yes(figs['all_seeds_share'] >= SHARE_BAR)} |",
        *(
            f"| 90th percentile of regret at {c} trials | {v:.1%} | "
            + (f"<= {P90_BAR:.0%} | {yes(v <= P90_BAR)} |" if c == 40 else "- | - |")
            for c, v in sorted(figs["p90_regret"].items())
        ),
        "",
    ]
    lines += exact_lines(result, tol)
    lines += span_lines(result, tol)
    missed = sorted((d for d in result["replays"] if None in d["trials"]), key=_worst_first)
    if missed:
        lines += [
            f"Draws where a seed missed ({len(missed)}; the worst {min(SHOWN, len(missed))}):",
            "",
            "| draw | trials per seed | worst regret at the end | what it is |",
            "|---|---|---|---|",
        ]
        for row in missed[:SHOWN]:
            trials = ", ".join("-" if t is None else str(t) for t in row["trials"])
            lines.append(f"| {row['draw']} | {trials} | {_end_regret(row):.1%} | {row['description']} |")
        lines += ["", *_lacks_lines(result, tol), ""]
    return "\n".join(lines)


def exact_lines(result: DrawBenchmark, tol: str) -> list[str]:
    """The figures of the same draws with exact readings (``DrawPlan.exact``), beside the bars; none for a run
    written before they were kept."""
    exact = result.get("exact")
    if exact is None:
        return []
    median = (
        "none (more than half missed)" if exact["median_trials"] is None else f"{exact['median_trials']:g}"
    )
    budget = result["budget"]
    at = max(exact["p90_regret"])
    return [
        f"The same draws with exact readings (no launch or request noise; one replay each, as a seed changes only the "
        f"noise): median trials to {tol} {median}, draws within {tol} by {budget} trials "
        f"{exact['all_seeds_share']:.0%}, 90th percentile of regret at {at} trials {exact['p90_regret'][at]:.1%}. "
        "These are what the order of the stages costs; the rest of the gap to the bars is what the noise costs.",
        "",
    ]


def span_lines(result: DrawBenchmark, tol: str) -> list[str]:
    """Where a replay's first trials go (``hardware_span``), the median over the replays where the hardware stage
    ran; none for a run written before spans were kept."""
    pairs = [
        (span, trials)
        for d in result["replays"]
        for span, trials in zip(d.get("spans", []), d["trials"])
        if span is not None
    ]
    if not pairs:
        return []
    ends = [sum(span) for span, _ in pairs]
    by_end = np.mean([trials is not None and trials <= end for end, (_, trials) in zip(ends, pairs)])
    return [
        f"Where the first trials go ({len(pairs)} replays with a hardware stage, medians): "
        f"{np.median([span[0] for span, _ in pairs]):g} before the hardware stage (the baseline, a probe per draft "
        f"and lookup, the best K), {np.median([span[1] for span, _ in pairs]):g} in it, over by trial "
        f"{np.median(ends):g} (by trial {MEDIAN_BAR} in {np.mean(np.array(ends) <= MEDIAN_BAR):.0%} of the "
        f"replays); {by_end:.0%} of the replays are within {tol} by its end.",
        "",
    ]


def _lacks_lines(result: DrawBenchmark, tol: str) -> list[str]:
    """The missed replays by what they lack (``lacks``), most first; none for a run written before it was kept."""
    tally = Counter(lack for d in result["replays"] for lack in d.get("lacks", []) if lack is not None)
    if not tally:
        return []
    groups = ", ".join(f"{name} {count}" for name, count in tally.most_common())
    return [
        f"What the missed replays lack ({sum(tally.values())}; the one knob group that, set to the optimum's in the "
        f"best configuration a replay tried, brings it within {tol} of the optimum): {groups}."
    ]
