"""What a race granted everything that narrows a bound could state: the reference for the stand-in's race bar.

Why: the stand-in's bar (``race_bench.STAND_IN_BAR``) asks the race to state a median loss of at most 5% within 45
launches at the 32B-scale stand-in (nine finalists from 100% down to 93%, 5% launch spread) with the bound holding
in 95% of races. Whether a race can
is a question about the field and the statistics, not only about the race's rules, so it is answered here without
them. The race here is granted:

* the launch spread, known: normal quantiles, no degrees of freedom spent on it, and no three rounds before a
  finalist has a bound (each finalist is launched ``FIRST`` times, then as the race chooses);
* one look: the bound is stated once, at the budget's end, so no share of the error level goes to looks before it;
* independent launches: no round effect to take out, so a comparison gains from every launch of either finalist;
* a critical value calibrated for this very race: the least that keeps the deployed one's bound at 95% on every
  field of a family least favourable to it (the best ahead of eight level finalists by 0 to 3 launch spreads;
  ``calibrated``), beside Bonferroni's over the comparisons with the best at one look.

Each launch after the first goes where the stated loss comes from: to the finalist whose term of the leader's
stated loss (``x_j - x_leader + c * sigma * sqrt(1/n_j + 1/n_leader)``, from the readings' estimates) is the largest,
or to the leader, whichever narrows that term more. The figure is the leader's stated loss at the end, its median
over simulated races, and how often it held (the deployed one's true loss at most the stated one). The product's
race has none of these grants; the difference between its figure and this one is what its statistics cost.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

from benchmarks.table import markdown_table
from tuner.decisions import evidence
from tuner.decisions.race.paired_statistics import CAP_SHARE

BASELINE_LAUNCHES = evidence.MIN_ROUNDS  # the baseline is launched for the speedup the race prints
FIRST = 2  # launches of each finalist before the race chooses (a spread known, two readings give an estimate)
RACES = 20_000  # simulated races per figure
CALIBRATION_RACES = 4_000  # simulated races per field while the critical value is calibrated
LEADS = tuple(np.arange(0.0, 3.01, 0.25))  # the family's leads of the best over the others, in launch spreads
LEVEL = 1 - evidence.ALPHA  # the share of races the deployed one's bound must hold in


@dataclass
class ToldTheTruth:
    budget: int  # launches, the baseline's included
    bonferroni: float  # the critical value over the comparisons with the best at one look
    calibrated: float  # the least value keeping the deployed one's bound at 95% over ``family``
    median_bonferroni: float  # the stand-in: the leader's median stated loss at Bonferroni's value
    holds_bonferroni: float
    median_calibrated: float  # and at the calibrated value
    holds_calibrated: float
    least_held: float  # the calibrated value's share held at the family's least favourable field
    launches: list[float]  # mean launches per finalist at the calibrated value (the best first)


def race(
    logs: np.ndarray,
    sigma: float,
    launches: int,
    critical: float,
    rng: np.random.Generator,
    races: int,
    first: int = FIRST,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``races`` simulated races at once over finalists with true log rates ``logs``: ``first`` launches each, then
    each launch to where the leader's stated loss comes from (the module's docstring). The leader's stated loss
    (log), its true one (how much faster the fastest other is; below zero where the leader is the best, so a margin
    claimed over every other is checked too), and the launches per finalist."""
    count = len(logs)
    rows = np.arange(races)
    counts = np.full((races, count), float(first))
    sums = logs * first + rng.standard_normal((races, count)) * sigma * np.sqrt(first)

    def terms() -> tuple[np.ndarray, np.ndarray]:
        estimates = sums / counts
        leader = estimates.argmax(axis=1)
        spread = np.sqrt(1 / counts + 1 / counts[rows, leader][:, None])
        bound = estimates - estimates[rows, leader][:, None] + critical * sigma * spread
        bound[rows, leader] = -np.inf
        return leader, bound

    for _ in range(launches - first * count):
        leader, bound = terms()
        widest = bound.argmax(axis=1)
        own, lead = counts[rows, widest], counts[rows, leader]
        now = np.sqrt(1 / own + 1 / lead)
        pick = np.where(
            now - np.sqrt(1 / (own + 1) + 1 / lead) >= now - np.sqrt(1 / own + 1 / (lead + 1)), widest, leader
        )
        sums[rows, pick] += logs[pick] + rng.standard_normal(races) * sigma
        counts[rows, pick] += 1
    leader, bound = terms()
    margins = logs[None, :] - logs[leader][:, None]
    margins[rows, leader] = -np.inf
    return bound.max(axis=1), margins.max(axis=1), counts


def family(count: int, sigma: float) -> list[np.ndarray]:
    """Fields least favourable to the deployed one's bound: the best ahead of ``count - 1`` level finalists by each
    of ``LEADS`` launch spreads (the least favourable shape among the best ahead of 1, 2, 4 or 8 level others when it
    was scanned, for a race whose launches were allocated in advance; the chasing race here was checked on the
    stand-in and on fields with the best 0-9% ahead of eight level finalists, and held in at least 95%)."""
    return [np.array([0.0] + [-lead * sigma] * (count - 1)) for lead in LEADS]


def share_held(fields: list[np.ndarray], sigma: float, launches: int, critical: float, seed: int) -> float:
    """The least share of races, over ``fields``, whose deployed one's true loss is at most the stated one."""
    shares = []
    for index, logs in enumerate(fields):
        stated, true_loss, _ = race(
            logs, sigma, launches, critical, np.random.default_rng(seed + index), CALIBRATION_RACES
        )
        shares.append(float(np.mean(true_loss <= stated)))
    return min(shares)


def calibrated(count: int, sigma: float, launches: int, high: float, seed: int) -> float:
    """The least critical value (up to ``high``) at which the deployed one's bound holds in ``LEVEL`` of races at
    every field of ``family``: a bisection, the same simulated races at every value tried."""
    fields, low = family(count, sigma), 0.0
    for _ in range(10):
        middle = (low + high) / 2
        low, high = (
            (low, middle) if share_held(fields, sigma, launches, middle, seed) >= LEVEL else (middle, high)
        )
    return high


def told_the_truth(
    field: list[float], sigma: float, budget: int, alpha: float = evidence.ALPHA, seed: int = 0
) -> ToldTheTruth:
    """The race of the module's docstring at ``field`` (true rates, the best first, finalists only) in ``budget``
    launches, at Bonferroni's critical value and at the calibrated one."""
    logs = np.log(np.asarray(field, dtype=float))
    launches = budget - BASELINE_LAUNCHES
    bonferroni = NormalDist().inv_cdf(1 - alpha / (len(logs) - 1))
    least = calibrated(len(logs), sigma, launches, bonferroni, seed)
    figures = {}
    for name, critical in (("bonferroni", bonferroni), ("calibrated", least)):
        stated, true_loss, counts = race(
            logs, sigma, launches, critical, np.random.default_rng(seed + 100), RACES
        )
        figures[name] = (
            float(np.expm1(np.median(stated))),
            float(np.mean(true_loss <= stated)),
            counts.mean(axis=0),
        )
    return ToldTheTruth(
        budget=budget,
        bonferroni=bonferroni,
        calibrated=least,
        median_bonferroni=figures["bonferroni"][0],
        holds_bonferroni=figures["bonferroni"][1],
        median_calibrated=figures["calibrated"][0],
        holds_calibrated=figures["calibrated"][1],
        least_held=share_held(family(len(logs), sigma), sigma, launches, least, seed + 200),
        launches=[round(float(x), 1) for x in figures["calibrated"][2]],
    )


def told_the_truth_figures(field: list[float], sigma: float, budgets: tuple[int, ...]) -> list[dict]:
    return [asdict(told_the_truth(field, sigma, budget)) for budget in budgets]


def withdrawn(
    field: list[float], sigma: float, budgets: tuple[int, ...], alpha: float = evidence.ALPHA, seed: int = 0
) -> list[dict]:
    """The grants withdrawn one at a time, each row keeping the ones before withdrawn: where the product's race
    loses its width. The critical values are the product's own (Bonferroni over the comparisons with the best):
    at one look; at the race's cap, which holds ``CAP_SHARE`` of the level; with Student's t on the launches'
    degrees of freedom (the spread estimated from them); and with ``evidence.MIN_ROUNDS`` launches of each finalist
    before any bound."""
    logs = np.log(np.asarray(field, dtype=float))
    comparisons = len(logs) - 1
    rows = []
    for budget in budgets:
        launches = budget - BASELINE_LAUNCHES
        at_cap = alpha * CAP_SHARE / comparisons
        estimated = evidence.t_quantile(1 - at_cap, launches - len(logs))
        steps = (
            ("every grant: one look, the spread known", NormalDist().inv_cdf(1 - alpha / comparisons), FIRST),
            ("the race's level at its cap (CAP_SHARE of it)", NormalDist().inv_cdf(1 - at_cap), FIRST),
            ("and the spread estimated (Student's t)", estimated, FIRST),
            (f"and {evidence.MIN_ROUNDS} launches of each first", estimated, evidence.MIN_ROUNDS),
        )
        for name, critical, first in steps:
            stated, true_loss, _ = race(
                logs, sigma, launches, critical, np.random.default_rng(seed), RACES, first
            )
            rows.append(
                {
                    "budget": budget,
                    "step": name,
                    "critical": critical,
                    "median": float(np.expm1(np.median(stated))),
                    "holds": float(np.mean(true_loss <= stated)),
                }
            )
    return rows


def told_the_truth_lines(
    rows: list[dict], steps: list[dict], finalists: int, sigma: float, bar_loss: float
) -> list[str]:
    """The tables under the stand-in's: at each budget, what the race granted everything could state, and the
    grants withdrawn one at a time."""
    if not rows:
        return []

    def median(figure: float) -> str:
        return f"{figure:.2%}{' (above the bar)' if figure > bar_loss else ''}"

    return [
        "",
        f"What a race granted everything that narrows a bound could state at the stand-in ({finalists} finalists, "
        f"{sigma:.0%} launch spread; `benchmarks/race_told_the_truth`): the spread known, one look, independent "
        f"launches, {FIRST} launches of each finalist and then each launch to where the stated loss comes from; at "
        "Bonferroni's critical value over the comparisons with the best, and at the least value that keeps the "
        "deployed one's bound at 95% on the fields least favourable to it (calibrated). Medians over "
        f"{RACES:,} simulated races; a budget counts the baseline's {BASELINE_LAUNCHES} launches:",
        "",
        *markdown_table(
            (
                "launches",
                "critical value: Bonferroni, calibrated",
                "median stated (holds): Bonferroni",
                "calibrated",
                "held at the least favourable field",
                "mean launches per finalist (calibrated; the best first)",
            ),
            (
                (
                    str(r["budget"]),
                    f"{r['bonferroni']:.2f}, {r['calibrated']:.2f}",
                    f"{median(r['median_bonferroni'])} ({r['holds_bonferroni']:.1%})",
                    f"{median(r['median_calibrated'])} ({r['holds_calibrated']:.1%})",
                    f"{r['least_held']:.1%}",
                    ", ".join(f"{mean:.1f}" for mean in r["launches"]),
                )
                for r in rows
            ),
        ),
        "",
        "The grants withdrawn one at a time (each row keeps the rows before it withdrawn; the product's critical "
        "values, Bonferroni over the comparisons with the best; the same simulated races):",
        "",
        *markdown_table(
            ("launches", "withdrawn", "critical value", "median stated", "holds"),
            (
                (
                    str(r["budget"]),
                    r["step"],
                    f"{r['critical']:.2f}",
                    median(r["median"]),
                    f"{r['holds']:.1%}",
                )
                for r in steps
            ),
        ),
    ]
