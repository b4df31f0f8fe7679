"""Stage 2c, serving (a study with several users: the space has serving knobs).

With the best configuration so far: the slots at the objective's level first (fewer queue users, more only
hold memory), then a unimodal walk over each serving knob in turn (micro batch, batch, flash attention, K and
V cache types by their bits, polling), a knob left once its best value's neighbours are measured. Serving
knobs scale with the load, not like threads: a batch of users' tokens reads the weights once, so their best
values are the load's. Until then every trial runs the baseline's serving settings, so speculation is
fitted on them.
"""

from __future__ import annotations

from typing import Any

from tuner.knobs.registry import SERVING_KNOBS
from tuner.search.history import PastTrial
from tuner.search.stages.configs import describe_speculation, nearest
from tuner.search.stages.state import Proposal, SearchState

# KV cache types from the most bits to the fewest: a walk over them trades bandwidth for quality.
KV_ORDER = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "iq4_nl", "q4_0")


def propose(state: SearchState) -> Proposal | None:
    """The serving knobs in turn with the best configuration: slots at the objective's level first, then a
    unimodal walk over each knob's ordered values (KV cache types by their bits) until its best is bracketed."""
    incumbent = state.overall_best()
    if incumbent is None:
        return None
    for knob in (k for k in SERVING_KNOBS if len(state.knobs.values(k)) > 1):
        found = state.first_new(steps(state, incumbent, knob))
        if found:
            return found
    return None


def ordered_values(state: SearchState, knob: str) -> list:
    """A knob's values in walking order (KV cache types by their bits)."""
    values = state.knobs.values(knob)
    if knob in ("cache_type_k", "cache_type_v"):
        values = sorted(values, key=lambda v: KV_ORDER.index(v) if v in KV_ORDER else len(KV_ORDER))
    return values


def steps(state: SearchState, incumbent: PastTrial, knob: str) -> list[tuple]:
    """Candidates for one serving knob around the incumbent: none once some walk bracketed the incumbent's value."""
    values = ordered_values(state, knob)
    mine = incumbent.params.get(knob)
    if mine not in values or bracketed(state, incumbent.params, knob, values):
        return []
    by_value = walk(state, incumbent.params, knob)
    best = max(
        (v for v, r in by_value.items() if r.feasible), key=lambda v: by_value[v].measured_value, default=mine
    )
    what = describe_speculation(incumbent.params)
    candidates = []
    if knob == "parallel" and state.users and state.users not in by_value:
        level = nearest(values, state.users)
        candidates.append(
            (
                {**incumbent.params, knob: level},
                "serving",
                f"{level} slots for {state.users} users at once (fewer queue them) with {what}",
            )
        )
    best_index = values.index(best)
    for neighbour in (best_index - 1, best_index + 1):
        if 0 <= neighbour < len(values) and values[neighbour] not in by_value:
            candidates.append(
                (
                    {**incumbent.params, knob: values[neighbour]},
                    "serving",
                    f"{knob} {values[neighbour]} next to the best so far ({best}) with {what}",
                )
            )
    return candidates


def walk(state: SearchState, params: dict, knob: str) -> dict[Any, PastTrial]:
    """The measured trials that differ from ``params`` only in ``knob`` (and a V cache type flash attention
    drops), best per value."""
    free = {knob, "cache_type_v"} if knob == "flash_attn" else {knob}
    fixed = {k: v for k, v in params.items() if k not in free}
    by_value: dict[Any, PastTrial] = {}
    for trial in state.trials:
        if (
            trial.measured
            and trial.params.get(knob) is not None
            and set(trial.params) - free <= set(fixed)
            and all(trial.params.get(k) == v for k, v in fixed.items())
        ):
            value = trial.params[knob]
            if value not in by_value or trial.measured_value > by_value[value].measured_value:
                by_value[value] = trial
    return by_value


def bracketed(state: SearchState, params: dict, knob: str, values: list) -> bool:
    """Some walk over ``knob`` (around any configuration) found ``params``' value best with its neighbours
    measured: serving knobs scale the rate about alike whatever the others are, so it is not walked again."""
    mine = params.get(knob)
    mine_index = values.index(mine)
    neighbours = [values[j] for j in (mine_index - 1, mine_index + 1) if 0 <= j < len(values)]
    for trial in state.trials:
        if trial.measured and trial.params.get(knob) == mine:
            by_value = walk(state, trial.params, knob)
            best = max(
                (v for v, x in by_value.items() if x.feasible),
                key=lambda v: by_value[v].measured_value,
                default=None,
            )
            if best == mine and all(n in by_value for n in neighbours):
                return True
    return False
