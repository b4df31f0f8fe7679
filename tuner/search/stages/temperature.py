"""Stage 3b, the temperature: a unimodal walk from the best configuration, and the best K at each.

Acceptance changes with the temperature, so the best configuration's neighbours in temperature are
measured until the rate falls or quality does (a temperature below the quality floor, with any option, rules
out the hotter ones: ``SearchState.lossless``); then, for each temperature measured close to the best, the
K the speculation model predicts from its acceptance there and the draft cost fitted at the start. A
temperature walked with the incumbent's option at other hardware or K is not walked again (``walked``); a step
that read within the noise of the incumbent is walked past (``level_with``).
"""

from __future__ import annotations

import math

from tuner.search.history import PastTrial
from tuner.search.prior import HW_KNOBS
from tuner.search.speedup_model import DraftFit, Point, drafting_share
from tuner.search.stages.configs import is_stacked, option_of
from tuner.search.stages.state import Proposal, SearchState


def propose(state: SearchState) -> Proposal | None:
    """The temperatures next to the best not measured yet, then the best K predicted for each measured one."""
    temperatures = sorted(state.knobs.values("temperature"))
    incumbent = state.overall_best()
    if len(temperatures) < 2 or incumbent is None or not option_of(incumbent.params):
        return None
    found = state.first_new(neighbours(state, incumbent, temperatures))
    if found or not state.k_values or is_stacked(incumbent.params):  # a stack's acceptance mixes two sources
        return found
    return best_k_per_temperature(state, incumbent)


def neighbours(state: SearchState, incumbent: PastTrial, temperatures: list) -> list[tuple]:
    """The incumbent at the temperatures next to its own, below the first one found infeasible."""
    params = incumbent.params
    family = state.family(params, "temperature")
    hot = first_infeasible(state, params)
    seen = {r.params.get("temperature") for r in family} | walked(state, params)
    best = params.get("temperature")
    at = temperatures.index(best) if best in temperatures else 0
    steps = [
        (
            t,
            f"temperature {t} next to the best so far ({best}) with the best configuration (acceptance changes with it)",
        )
        for t in temperatures[max(0, at - 1) : at + 2]
    ]
    for level in level_with(state, incumbent, family):
        if level not in temperatures:  # measured in an earlier study's space
            continue
        place = temperatures.index(level)
        beyond = temperatures[place + 1] if level > best and place + 1 < len(temperatures) else None
        beyond = temperatures[place - 1] if level < best and place > 0 else beyond
        if beyond is not None:
            steps.append(
                (
                    beyond,
                    f"temperature {beyond} past {level}, which read within the noise of the best ({best}) with "
                    f"the best configuration (it may be the better one, read low)",
                )
            )
    return [
        ({**params, "temperature": step}, "speculation", reason)
        for step, reason in steps
        if step < hot and step not in seen
    ]


def first_infeasible(state: SearchState, params: dict) -> float:
    """The lowest temperature measured below the quality floor at ``params``' experts, with any speculation
    (``SearchState.lossless``: speculation keeps the target's output distribution); infinite where none was."""
    return min(
        (r.params["temperature"] for r in state.lossless(params, "temperature") if not r.feasible),
        default=math.inf,
    )


def level_with(state: SearchState, incumbent: PastTrial, family: list[PastTrial]) -> list:
    """The other temperatures measured with the incumbent's other knobs (any K) whose best reading is within the
    noise of the incumbent's (``SearchState.close``), nearest the incumbent's first. Why: the incumbent is the
    highest of many single readings, so it reads high; a temperature a few percent better in truth often reads
    just below it, and the walk from the incumbent alone stops there (development draw 47 seed 0: 0.3, 6% above 0.0 in
    truth, read below the incumbent three times, and 0.5, better still, was never measured; docs/decisions.md,
    "Held-out draws")."""
    own = incumbent.params.get("temperature")
    if own is None:
        return []
    readings: dict = {}
    for trial in family:
        step = trial.params.get("temperature")
        if trial.feasible and trial.state == "complete" and step != own and step is not None:
            readings[step] = max(readings.get(step, 0.0), trial.measured_value)
    floor = (1 - state.close) * incumbent.measured_value
    return sorted((t for t, v in readings.items() if v >= floor), key=lambda t: abs(t - own))


def walked(state: SearchState, params: dict) -> set:
    """The temperatures that lost to the configuration's own, by more than the noise (``SearchState.close``), where
    both were measured with its option at the same other knobs (any hardware, K and n-gram sizes): the temperature
    moves acceptance, which the threads, the NUMA policy and K barely change, so a step that lost clearly once is
    not walked again from each new incumbent. Why: on development draws 0-39 every new incumbent (another K or
    thread count found later, often by one launch reading high) walked the same temperature again, and it read
    below each time (draw 8 seed 0: temperature 0.3 four times, 5 to 10% below). A step measured only elsewhere,
    within the noise of it there (draw 17 seed 0: 0.5 read just below 0.3 on one launch, 3.6% above it in truth),
    or that won in any such pair, is walked."""
    own = params.get("temperature")
    pairs: dict[tuple, dict] = {}
    for r in state.family(params, "temperature", *HW_KNOBS, "threads_batch"):
        if r.feasible and r.state == "complete":
            key = tuple(sorted((k, v) for k, v in r.params.items() if k != "temperature"))
            at = pairs.setdefault(key, {})
            t = r.params.get("temperature")
            at[t] = max(at.get(t, 0.0), r.measured_value)
    floor = 1 - state.close
    compared = [
        (t, v < floor * at[own]) for at in pairs.values() if own in at for t, v in at.items() if t != own
    ]
    return {t for t, _ in compared} - {t for t, lost in compared if not lost}


def best_k_per_temperature(state: SearchState, incumbent: PastTrial) -> Proposal | None:
    """At each other temperature measured within 5% of the best: the K predicted from its acceptance there
    with the draft cost fitted at the start, where it gains over 1% and could come within 1% of the best."""
    params = incumbent.params
    option = option_of(params)
    assert option is not None, "the temperature stage walks only an incumbent that speculates"
    start = state.start()
    at_start = state.fit_option(option, start.temperature, start.experts)
    if at_start is None:
        return None
    family = state.family(params, "temperature", "experts")
    top = max((r.measured_value for r in family if r.feasible), default=0.0)
    measured = [
        r
        for r in family
        if r.feasible
        and r.acceptance
        and r.params.get("experts") == params.get("experts")
        and r.params.get("temperature") != start.temperature
        and r.measured_value >= 0.95 * top
    ]
    candidates = []
    for trial in sorted(measured, key=lambda r: -r.measured_value):
        assert trial.acceptance is not None, "measured keeps only trials with an acceptance"
        k_measured = trial.params["draft_max"]
        point = Point(
            k_measured, trial.acceptance, None, drafting_share(trial.drafted, trial.steps, k_measured)
        )
        model = DraftFit((point,), at_start.c, at_start.overhead)
        best_k = model.best_k(state.k_values)
        gain = model.predict(best_k) / model.predict(k_measured)
        if gain > 1.01 and trial.measured_value * gain > incumbent.measured_value * 0.99:
            candidates.append(
                (
                    {**trial.params, "draft_max": best_k},
                    "speculation",
                    f"predicted best K={best_k} at temperature {trial.params.get('temperature')} "
                    f"from {model.describe()}: +{gain - 1:.0%}",
                )
            )
    return state.first_new(candidates)
