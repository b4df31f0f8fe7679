"""Stage 3a, the experts (a MoE target): the expert count walked down to the quality floor.

Fewer experts per token is faster until quality falls below the floor: a bisection between the fewest
feasible count and the most infeasible one below it. Speculative decoding keeps the target's output
distribution, so a count below the floor with one option rules it out for all (``SearchState.lossless``).
With fewer experts the target alone is faster too, so it is measured again: does speculation still pay?
"""

from __future__ import annotations

from typing import Any

from tuner.search.history import PastTrial
from tuner.search.stages.configs import nearest, option_of
from tuner.search.stages.state import Proposal, SearchState

DRAFT_KNOBS = ("draft", "draft_max", "draft_min", "draft_p_min")  # what the target alone does not have


def propose(state: SearchState) -> Proposal | None:
    """For a MoE target: the next count of the bisection, then the target alone at the incumbent's count."""
    values = state.knobs.values("experts")
    incumbent = state.overall_best()
    if len(values) < 2 or incumbent is None or incumbent.params.get("experts") is None:
        return None
    candidates = bisection(state, incumbent, values)
    if option_of(incumbent.params):
        alone = {k: v for k, v in incumbent.params.items() if k not in DRAFT_KNOBS}
        candidates.append(
            (
                {**alone, "spec_type": "none"},
                "speculation",
                f"target alone at experts={incumbent.params['experts']}: does speculation still pay?",
            )
        )
    return state.first_new(candidates)


def best_per_count(state: SearchState, incumbent: PastTrial) -> dict[Any, PastTrial]:
    """The incumbent's family (same speculative type) at each expert count, best per count."""
    family = [
        r
        for r in state.family(incumbent.params, "experts")
        if r.params.get("spec_type") == incumbent.params.get("spec_type")
    ]
    by_count: dict[Any, PastTrial] = {}
    for trial in family:
        if (
            trial.params.get("experts") not in by_count
            or trial.measured_value > by_count[trial.params["experts"]].measured_value
        ):
            by_count[trial.params.get("experts")] = trial
    return by_count


def bisection(state: SearchState, incumbent: PastTrial, values: list) -> list[tuple]:
    """The count halfway between the fewest feasible and the floor (the most infeasible below it), while
    the fewest feasible is within 1% of the fastest."""
    by_count = best_per_count(state, incumbent)
    good = [e for e, r in by_count.items() if r.feasible]
    lo = min(good)
    floor = max(
        (
            r.params["experts"]
            for r in list(by_count.values()) + state.lossless(incumbent.params, "experts")
            if not r.feasible and r.params["experts"] < lo
        ),
        default=min(values) - 1,
    )
    fastest = max(by_count[e].measured_value for e in good)
    if lo - floor <= 1 or by_count[lo].measured_value < 0.99 * fastest:
        return []
    count = nearest([v for v in values if floor < v < lo], (floor + lo) / 2)
    return [
        (
            {**incumbent.params, "experts": count},
            "speculation",
            f"experts {count}: fewer is faster until quality falls below the floor "
            f"(feasible down to {lo}{'' if floor < min(values) else f', not at {floor}'})",
        )
    ]
