"""5: the research's regime on real llama.cpp, the scale target's measured K sweep against the search.

Why: the built-in target fits in a big server's L3 and its drafts cost a third of its step, so large K,
lookup and the K model were never seen where they matter. ``studies/scale-grid.yaml`` names the scale
target (1.3 GB, memory-bound on any host; its drafts cost a few hundredths of a step) and the sweep:
every K of each draft model (alone and with ngram-mod stacked in front) and lookup type, recorded once per
content type (code, prose, summaries) with ``python -m benchmarks record-grid``. On each sweep this section reads:

- each family's best K in the sweep against the K the structured search predicts for it: the model
  fitted to the probe at K=8 and to the predicted best K measured, as ``search.stages.best_k`` walks it;
- the structured search's pick within 20 trials, replayed on the sweep with the sweep's own noise,
  against the sweep's best (``bench.replay``);
- the scale study's race, when the study has been run in this storage: its deployment's speculation looked
  up in each sweep, against the sweep's best and the loss bound the race stated; and against the sweeps
  pooled as the race's traffic (``pooled_sweeps``): the race ranks one configuration for every content
  type, so its stated loss is about their mix, not about code alone;
- on summaries, whether prompt lookup (alone or stacked) is the best family, as the research found on
  documents.

The sweeps' own bests are measured, never written into the model or a study.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks import replay
from benchmarks.grid import record_grid, table_frame
from benchmarks.grid_recorder import latest_rows, quiet_readings, rebased, recorded_rows
from benchmarks.sweep_leaders import LEADER_ROUNDS, leaders_path, read_leaders
from benchmarks.table import markdown_table, read_table
from tuner.decisions.race.results import RaceResult
from tuner.errors import UserError
from tuner.figure_text import percent_up
from tuner.knobs.registry import LOOKUP_TYPES
from tuner.progress import Progress
from tuner.search.speedup_model import Point, drafting_share, walk
from tuner.search.stages.best_k import LEADER_STEPS
from tuner.search.stages.configs import K_PROBE
from tuner.storage import store
from tuner.studyfile.spec import StudySpec

SUITES = ("code", "prose", "summarize")
SEARCH_BUDGET = 20  # trials within which the search must come within PICK_TOLERANCE of the sweep's best
PICK_TOLERANCE = 0.03  # the search's pick within 3% of the sweep's best
STUDY = "scale"  # the study whose race is checked against the sweeps (`make study STUDY=scale`)


def suite_spec(spec: StudySpec, suite: str) -> StudySpec:
    """The sweep on one content type: the study's grid over that suite alone, named after it."""
    return replace(spec, name=f"{spec.name}-{suite}", suites=(suite,))


def family_of(row: Any) -> str | None:
    """The speculation family a sweep row (or a trial's configuration) belongs to: a draft model by name, a
    lookup type, or a lookup stacked in front of a draft model (``ngram-mod + draft-large``)."""
    if row["spec_type"] == "none":
        return None
    if row["spec_type"] == "draft-simple":
        lookup = row.get("lookup")
        stacked = isinstance(lookup, str) and lookup != "none"
        return f"{lookup} + {row['draft']}" if stacked else str(row["draft"])
    return str(row["spec_type"])


def is_lookup(family: str) -> bool:
    """A family that drafts from the prompt: a lookup type alone or stacked on a draft model."""
    return family.split(" + ")[0] in LOOKUP_TYPES


def families(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Each family's measured rows, by K."""
    ok = frame[(frame["status"] == "ok") & frame["feasible"].astype(bool)]
    named = ok.assign(family=[family_of(row) for _, row in ok.iterrows()]).dropna(subset=["family"])
    return {name: rows.sort_values("draft_max") for name, rows in named.groupby("family", sort=True)}


def decode_steps(frame: pd.DataFrame, reference: dict | None = None) -> pd.Series | None:
    """Each row's target decode steps after each request's first token (generated - requests - accepted, as
    ``search.history.draft_counts`` counts a trial's): from the row's own ``generated`` and ``requests``, or,
    for a sweep recorded before those, from the baseline's reference outputs (``.reference.json``: every
    feasible row answers as the baseline did, so it generated as many tokens) times the row's repetitions.
    None where neither is known."""
    if {"generated", "requests", "accepted"} <= set(frame.columns):
        return frame["generated"] - frame["requests"] - frame["accepted"]
    if reference is None or not {"repetitions", "accepted"} <= set(frame.columns):
        return None
    outputs = reference.get("tokens", {})
    generated = sum(len(tokens) for tokens in outputs.values())
    return frame["repetitions"] * (generated - len(outputs)) - frame["accepted"]


def predicted_best_k(rows: pd.DataFrame, ks: list[int]) -> int | None:
    """The structured search's predicted best K from this family's sweep rows: the probe at K=8 fitted,
    its predicted best K measured and fitted again, ``LEADER_STEPS`` points in all (None: no probe). With a
    ``steps`` column (``decode_steps``) each point knows its share of steps that drafted, as a study's do."""
    by_k = {
        int(r.draft_max): Point(
            int(r.draft_max),
            float(r.acceptance),
            float(r.speedup),
            drafting_share(getattr(r, "drafted", None), getattr(r, "steps", None), int(r.draft_max)),
        )
        for r in rows.itertuples()
    }
    model = walk(by_k.get, ks, K_PROBE, LEADER_STEPS)
    return None if model is None else model.best_k(ks)


def rung_distance(ks: list[int], a: int, b: int) -> int:
    """How many rungs of the sweep's K ladder lie between two K values."""
    return abs(ks.index(a) - ks.index(b))


def stored_race(storage: str | None = None) -> RaceResult | None:
    """The scale study's race (the pooled one), when that study has been run in ``storage`` (None: the
    default storage); None when it has not."""
    try:
        study, _ = store.open_stored_study(STUDY, storage)
    except UserError:  # no such storage or study here: the scale study has not been run
        return None
    data = store.read_race(study)
    return None if data is None else RaceResult.from_json(data)


def race_in_sweep(
    frame: pd.DataFrame, race: RaceResult, best: dict | None, relaunched: dict | None = None
) -> dict[str, Any]:
    """The race's deployment looked up in one sweep (its family at its K, at the sweep's lookup sizes) against
    the sweep's best: how far below the best it measured (``shortfall``) and whether that lies within the loss
    the race stated (no other finalist more than ``loss_bound`` faster). A deployment among the sweep's
    relaunched leaders (``relaunched``) is read at its relaunched speedup, as the best is."""
    key = deployed_key(race)
    at = 1.0 if key is None else speedups(frame).get(key)
    for leader in (relaunched or {}).get("leaders", []):
        if key is not None and (family_of(leader), leader.get("draft_max")) == key:
            at = float(leader["speedup"])
    return deployment_against(race, at, None if best is None else best["best_speedup"])


def deployed_key(race: RaceResult) -> tuple[str, int] | None:
    """The race's deployment as a sweep names its configurations, (family, K); None for the baseline."""
    config = race.winning.config
    family = family_of(config)
    return None if family is None else (family, int(config["draft_max"]))


def deployment_against(race: RaceResult, at: float | None, best: float | None) -> dict[str, Any]:
    """The race's deployment measured at speedup ``at`` (None: not measured) against the ``best`` speedup: how
    far below it (``shortfall``) and whether that lies within the loss the race stated (no other finalist more
    than ``loss_bound`` faster)."""
    key = deployed_key(race)
    shortfall = None if at is None or best is None else max(0.0, 1.0 - at / best)
    return {
        "deployed": "the baseline" if key is None else f"{key[0]} K={key[1]}",
        "trial": race.winner,
        "stated_bound": race.loss_bound,
        "in_sweep": at,
        "shortfall": shortfall,
        "within": None if shortfall is None or race.loss_bound is None else shortfall <= race.loss_bound,
    }


def speedups(frame: pd.DataFrame) -> dict[tuple[str, int], float]:
    """Each measured configuration of one sweep, by (family, K), at its one-launch speedup over the sweep's
    baseline (the first row where a family repeats a K)."""
    return {
        (name, int(row["draft_max"])): float(row["speedup"])
        for name, rows in families(frame).items()
        for _, row in rows.drop_duplicates("draft_max").iterrows()
    }


def pooled_sweeps(frames: dict[str, pd.DataFrame], race: RaceResult | None) -> dict[str, Any] | None:
    """The sweeps read as the race's traffic: each configuration measured in every sweep at the harmonic mean
    of its speedups, the time its target takes for the same tokens of each content type, over the time the
    baseline takes (the baseline decodes every content type at one rate; the study's workload gives each
    swept type an equal share of its entries). The race's deployment against the best of that mix and the
    loss it stated. None with fewer than two sweeps."""
    if len(frames) < 2:
        return None
    each = [speedups(frame) for frame in frames.values()]
    common = set.intersection(*(set(s) for s in each))
    pooled = {key: len(each) / sum(1.0 / s[key] for s in each) for key in common}
    if not pooled:
        return None
    (family, k), best = max(pooled.items(), key=lambda item: item[1])
    found: dict[str, Any] = {
        "suites": list(frames),
        "configurations": len(pooled),
        "best": f"{family} K={k}",
        "best_speedup": best,
        "race": None,
    }
    if race is not None:
        key = deployed_key(race)
        found["race"] = deployment_against(race, 1.0 if key is None else pooled.get(key), best)
    return found


def sweep_figures(
    frame: pd.DataFrame,
    seeds: int,
    reference: dict | None = None,
    race: RaceResult | None = None,
    relaunched: dict | None = None,
) -> dict[str, Any]:
    """One content type's sweep: per family its best K and the predicted one; the best overall (from the
    relaunched leaders when ``relaunched``: ``benchmarks/sweep_leaders``); the search's pick within the budget; the
    scale study's deployment in it (``race``, when the study was run). ``reference``: the sweep's
    ``.reference.json``, for the decode steps of rows recorded without their own counts (``decode_steps``)."""
    if "draft_max" not in frame.columns:  # a sweep without speculation (a test's, or --quick's first launch)
        frame = frame.assign(draft_max=None)
    ks = sorted(int(k) for k in frame["draft_max"].dropna().unique())
    baseline = frame[frame["spec_type"] == "none"]["tokens_per_second"]
    readings = quiet_readings(reference)
    steps = decode_steps(frame, reference)
    counted = frame if steps is None else frame.assign(steps=steps)
    rows: list[dict[str, Any]] = []
    for name, fam in families(counted).items():
        best = fam.loc[fam["tokens_per_second"].idxmax()]
        predicted = predicted_best_k(fam, ks)
        rows.append(
            {
                "family": name,
                "best_k": int(best["draft_max"]),
                "best_speedup": float(best["speedup"]),
                "best_acceptance": float(best["acceptance"]),
                "predicted_k": predicted,
                "rungs_off": None
                if predicted is None
                else rung_distance(ks, predicted, int(best["draft_max"])),
                "measured": len(fam),
            }
        )
    leader = max(rows, key=lambda r: r["best_speedup"], default=None)
    if relaunched and relaunched.get("leaders"):
        leader = _relaunched_best(rows, relaunched, ks)
    search = _search_figures(frame, seeds) if len(frame) > 2 else None
    return {
        "baseline_tokens_per_second": float(reference["tokens_per_second"])
        if reference
        else (float(baseline.iloc[0]) if len(baseline) else None),
        "baseline_readings": readings,
        "families": rows,
        "best": leader,
        "search": search,
        "race": None if race is None else race_in_sweep(frame, race, leader, relaunched),
    }


def _relaunched_best(rows: list[dict[str, Any]], relaunched: dict, ks: list[int]) -> dict[str, Any]:
    """The sweep's best as its relaunched leaders rank it: the leader of the highest median speedup, with its
    family's predicted K, and every leader's speedup and range (``relaunched``)."""
    top = max(relaunched["leaders"], key=lambda r: r["speedup"])
    family = family_of(top)
    predicted = next((r["predicted_k"] for r in rows if r["family"] == family), None)
    k = int(top["draft_max"])
    return {
        "family": family,
        "best_k": k,
        "best_speedup": float(top["speedup"]),
        "best_acceptance": next((r["best_acceptance"] for r in rows if r["family"] == family), None),
        "predicted_k": predicted,
        "rungs_off": None if predicted is None else rung_distance(ks, predicted, k),
        "relaunched": {
            "rounds": relaunched["rounds"],
            "leaders": [
                {
                    "leader": f"{family_of(r)} K={r.get('draft_max')}",
                    "speedup": r["speedup"],
                    "low": r["low"],
                    "high": r["high"],
                }
                for r in sorted(relaunched["leaders"], key=lambda r: -r["speedup"])
            ],
        },
    }


def _search_figures(frame: pd.DataFrame, seeds: int) -> dict[str, Any]:
    """The structured search replayed on the sweep with its own noise: within 3% of its best by the budget?"""
    budget = min(SEARCH_BUDGET, len(frame))
    found = replay.benchmark(
        replay.load_landscape(frame),
        strategies=("default",),
        seeds=seeds,
        budget=budget,
        tolerance=PICK_TOLERANCE,
        jobs=1,
    )
    default = found["strategies"]["default"]
    return {
        "budget": budget,
        "seeds": seeds,
        "reached": default["reached"],
        "median_trials": default["median_trials"],
        "median_regret": default["median_regret_at"].get(budget),
    }


def measure_regime(
    out: Path,
    *,
    seeds: int,
    max_launches: int | None,
    study: StudySpec,
    shrink: Callable[[StudySpec], StudySpec] = lambda spec: spec,
) -> dict[str, Any]:
    """Record (fresh) and read each content type's sweep of ``study`` (the scale grid), with the scale study's
    race when it has been run in the default storage. ``shrink``: applied to each content type's study
    (``--quick``'s one prompt of the suite, not the whole suite)."""
    sweeps: dict[str, tuple[pd.DataFrame, Path, Path]] = {}
    for suite in SUITES:
        spec = shrink(suite_spec(study, suite))
        csv = out / f"grid-{spec.name}.csv"
        for stale in (csv.with_suffix(".jsonl"), csv.with_suffix(".reference.json"), leaders_path(csv)):
            stale.unlink(missing_ok=True)  # every figure from this session
        record_grid(
            spec,
            csv,
            progress=Progress.untimed(),
            max_launches=max_launches,
            leader_rounds=LEADER_ROUNDS if max_launches is None else 0,
        )
        sweeps[suite] = (read_table(csv), csv, csv)
    return _regime(str(study.path), sweeps, seeds, stored_race())


def recorded_regime(
    folder: Path, *, seeds: int, name: str = "scale-grid", race: RaceResult | None = None
) -> dict[str, Any]:
    """The same figures from sweeps already recorded in ``folder`` (``grid-NAME-SUITE.jsonl``, its last row per
    configuration, or the ``.csv`` table; the ``.reference.json`` beside it), measuring nothing
    (``python -m benchmarks bench-scale``); ``race``: the scale study's, looked up in each sweep."""
    sweeps: dict[str, tuple[pd.DataFrame, Path, Path]] = {}
    for suite in SUITES:
        csv = folder / f"grid-{name}-{suite}.csv"
        jsonl = csv.with_suffix(".jsonl")
        if jsonl.is_file():
            rows = rebased(list(latest_rows(recorded_rows(jsonl)).values()), _reference(csv))
            sweeps[suite] = (table_frame(rows), csv, jsonl)
        elif csv.is_file():
            sweeps[suite] = (read_table(csv), csv, csv)
    if not sweeps:
        raise UserError(f"{folder}: no recorded sweep grid-{name}-{{{','.join(SUITES)}}}.jsonl or .csv")
    return _regime(name, sweeps, seeds, race)


def _regime(
    name: str, sweeps: dict[str, tuple[pd.DataFrame, Path, Path]], seeds: int, race: RaceResult | None
) -> dict[str, Any]:
    """Each sweep's figures (``sweeps``: per suite its frame, its ``.csv`` path, the table it was read from),
    the sweeps pooled as the race's traffic, and the targets."""
    found: dict[str, Any] = {"study": name, "suites": {}}
    for suite, (frame, csv, table) in sweeps.items():
        figures = sweep_figures(frame, seeds, _reference(csv), race, read_leaders(csv))
        found["suites"][suite] = {**figures, "table": str(table)}
    found["pooled"] = pooled_sweeps({suite: frame for suite, (frame, _, _) in sweeps.items()}, race)
    found["targets"] = targets(found["suites"], found["pooled"])
    return found


def _reference(csv: Path) -> dict | None:
    """The sweep's reference outputs (``bench.grid_recorder``), if recorded."""
    path = csv.with_suffix(".reference.json")
    return json.loads(path.read_text()) if path.is_file() else None


def targets(suites: dict[str, Any], pooled: dict[str, Any] | None = None) -> dict[str, Any]:
    """The regime's targets, each True, False or None (not measured). The race's deployment is read against
    the sweeps pooled as its traffic (``pooled``), the mix it ranked its finalists on."""

    def best(suite: str) -> dict | None:
        return suites.get(suite, {}).get("best")

    code, prose = best("code"), best("prose")
    leaders_within_rung: list[int | None] = [
        next((f["rungs_off"] for f in suites[s]["families"] if b and f["family"] == b["family"]), None)
        for s, b in (("code", code), ("prose", prose))
        if s in suites
    ]
    searches = [suites[s]["search"] for s in suites if suites[s]["search"]]
    summaries = best("summarize")
    race = (pooled or {}).get("race")
    return {
        "code_best_k_at_least_12": None if code is None else code["best_k"] >= 12,
        "code_pays_x2_5": None if code is None else code["best_speedup"] >= 2.5,
        "prose_best_k_below_code": None
        if code is None or prose is None
        else prose["best_k"] < code["best_k"],
        "predicted_within_one_rung": (
            None
            if None in leaders_within_rung or not leaders_within_rung
            else all(r is not None and r <= 1 for r in leaders_within_rung)
        ),
        "search_within_3pct_in_20": (
            None
            if not searches
            else all(s["reached"] == s["seeds"] and s["median_trials"] is not None for s in searches)
        ),
        "summaries_best_lookup_or_stack": None if summaries is None else is_lookup(summaries["family"]),
        "race_within_stated_loss": None if race is None else race["within"],
    }


def _race_lines(race: dict | None, where: str = "in this sweep", best: str = "the sweep's best") -> list[str]:
    """The scale study's deployment in this sweep (or the pooled sweeps: ``where``), against ``best`` and the
    race's stated loss."""
    if race is None:
        return ["", f"the scale study's race: not run in this storage (`make study STUDY={STUDY}`)"]
    bound = race["stated_bound"]
    stated = (
        "no bound stated"
        if bound is None
        else (
            "no other finalist faster"
            if bound <= 0
            else f"no other finalist more than {percent_up(bound)} faster"
        )
    )
    if race["in_sweep"] is None:
        return [
            "",
            f"the scale study's race deployed {race['deployed']} (trial {race['trial']}): not measured {where}",
        ]
    verdict = {None: "", True: ": within the stated loss", False: ": MORE than the stated loss"}[
        race["within"]
    ]
    shortfall = "n/a" if race["shortfall"] is None else f"{race['shortfall']:.1%}"
    return [
        "",
        f"the scale study's race deployed {race['deployed']} (trial {race['trial']}; stated: {stated}): "
        f"x{race['in_sweep']:.2f} {where}, {shortfall} below {best}{verdict}",
    ]


def _pooled_lines(pooled: dict | None) -> list[str]:
    """The sweeps pooled as the race's traffic: the best of the mix and the race's deployment in it."""
    if not pooled:
        return []
    suites = " and ".join(pooled["suites"])
    return [
        f"**the sweeps pooled as the race's traffic** ({suites}, an equal share of tokens each; the harmonic mean "
        f"of each configuration's one-launch speedups, {pooled['configurations']} configurations measured in "
        f"every sweep): the best is {pooled['best']} x{pooled['best_speedup']:.2f}",
        *_race_lines(pooled["race"], where="pooled", best="the pooled best"),
        "",
    ]


def _relaunched_lines(best: dict | None) -> list[str]:
    """The sweep's leaders as their interleaved relaunches ranked them (``benchmarks/sweep_leaders``), when relaunched."""
    relaunched = (best or {}).get("relaunched")
    if not best or not relaunched:
        return []
    leaders = ", ".join(
        f"{r['leader']} x{r['speedup']:.2f} [{r['low']:.2f}, {r['high']:.2f}]" for r in relaunched["leaders"]
    )
    return [
        "",
        f"the sweep's leaders launched again, {relaunched['rounds']} interleaved rounds with the baseline (median rate "
        f"over the baseline's, the range of the per-round ratios): {leaders}; the sweep's best: {best['family']} K={best['best_k']}",
    ]


def _yes(value: bool | None) -> str:
    return {None: "not measured", True: "yes", False: "NO"}[value]


def markdown(found: dict[str, Any]) -> str:
    """Per content type: the families' best and predicted K; the best; the search's pick; then the targets."""
    lines: list[str] = []
    for suite, figures in found["suites"].items():
        base = figures["baseline_tokens_per_second"]
        readings = figures.get("baseline_readings") or []
        launches = (
            f", the median of {len(readings)} launches: {', '.join(f'{r:.1f}' for r in readings)}"
            if len(readings) > 1
            else ""
        )
        lines.append(
            f"**{suite}** (baseline {'n/a' if base is None else f'{base:.1f}'} tokens/s{launches}; {figures['table']})"
        )
        lines.append("")
        lines += markdown_table(
            ["family", "sweep's best K", "speedup there", "acceptance", "predicted best K", "rungs apart"],
            [
                [
                    f["family"],
                    str(f["best_k"]),
                    f"x{f['best_speedup']:.2f}",
                    f"{f['best_acceptance']:.2f}",
                    "no probe at K=8" if f["predicted_k"] is None else str(f["predicted_k"]),
                    "" if f["rungs_off"] is None else str(f["rungs_off"]),
                ]
                for f in figures["families"]
            ],
        )
        lines += _relaunched_lines(figures.get("best"))
        search = figures["search"]
        if search:
            trials = (
                "not within 3%"
                if search["median_trials"] is None
                else f"median {search['median_trials']:g} trials"
            )
            regret = search["median_regret"]
            lines.append("")
            lines.append(
                f"structured search replayed on this sweep ({search['seeds']} seeds, the sweep's own noise): within 3% "
                f"of the best in {search['reached']}/{search['seeds']} seeds within {search['budget']} trials, {trials}; "
                f"median regret at {search['budget']}: {'n/a' if regret is None or math.isnan(regret) else f'{regret:.1%}'}"
            )
        lines += _race_lines(figures.get("race"))
        lines.append("")
    lines += _pooled_lines(found.get("pooled"))
    t = found["targets"]
    lines.append(
        "targets: code's best K >= 12: "
        f"{_yes(t['code_best_k_at_least_12'])}; code pays >= x2.5: {_yes(t['code_pays_x2_5'])}; prose's best K below "
        f"code's: {_yes(t['prose_best_k_below_code'])}; predicted best K within one rung (the leading family, code and "
        f"prose): {_yes(t['predicted_within_one_rung'])}; the search within 3% of the sweep's best within 20 trials "
        f"in every seed: {_yes(t['search_within_3pct_in_20'])}; on summaries a lookup or a stack is the best family: "
        f"{_yes(t.get('summaries_best_lookup_or_stack'))}; the scale study's deployment within its stated loss of "
        f"the pooled sweeps' best (the traffic it ranked on): {_yes(t.get('race_within_stated_loss'))}"
    )
    return "\n".join(lines) + "\n"
