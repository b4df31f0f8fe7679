"""Stage 1c, the stacks: lookup types stacked on the best draft-model configuration.

llama.cpp drafts from the lookup where it finds a key and from the draft model elsewhere, so a stack pays
where lookup pays on some content and the draft on the rest. On the best draft-model configuration at the
baseline's hardware, temperature and experts (when it beats the target alone), the lookup types that paid
alone on some suite, closest to the best on those suites (and types never tried alone), each at the sizes it
did best with alone; then the best stack's lookup length doubled until bracketed, and the other types at that
length.
"""

from __future__ import annotations

import math

from tuner.knobs.registry import DRAFT_MODEL_TYPES
from tuner.search.history import PastTrial
from tuner.search.stages.configs import describe_speculation, hardware_params, is_stacked, nearest, option_of
from tuner.search.stages.state import Proposal, SearchState

LOOKUP_PAYS = 1.05  # a lookup pays on a suite where alone it is this much faster than the target alone


def propose(state: SearchState) -> Proposal | None:
    """Each chosen lookup type stacked on the best draft, then the stacked length (``stack_length``)."""
    lookups = [v for v in state.knobs.values("lookup") if v != "none"]
    start = start_match(state)
    drafts = [
        r
        for r in state.measured(**start)
        if r.feasible and not is_stacked(r.params) and r.params.get("spec_type") in DRAFT_MODEL_TYPES
    ]
    baseline = state.measured_baseline()
    best = max(drafts, key=lambda r: r.measured_value, default=None)
    if not lookups or best is None or best.measured_value <= baseline.measured_value:
        return None
    alone = {
        t: max(trials, key=lambda r: r.measured_value)
        for t in lookups
        if (trials := [r for r in state.measured(spec_type=t, **start) if r.feasible])
    }
    tried = {o[0] for o in state.options()} - set(
        alone
    )  # in the space, not measured alone (failed, or to come)
    paying = {t: pays_on(state, r) for t, r in alone.items()}
    # ranked on the suites where lookup pays: elsewhere it drafts little, and the draft model takes over
    suites = sorted({s for v in paying.values() for s in v})
    gain = {t: gain_on(state, alone[t], suites) for t, v in paying.items() if v}
    chosen = sorted((t for t in gain if gain[t] >= 0.97 * max(gain.values())), key=lambda t: -gain[t])
    chosen += [t for t in lookups if t not in alone and t not in tried]
    candidates = []
    for lookup in chosen:
        sizes, why = {}, "not measured alone"
        if lookup in alone:
            sizes = sizes_alone(state, alone[lookup].params)
            why = (
                f"alone x{alone[lookup].measured_value / baseline.measured_value:.2f}, "
                f"faster on {', '.join(paying[lookup])}"
            )
        candidates.append(
            (
                {**best.params, "lookup": lookup, **sizes},
                "stacks",
                f"{lookup} stacked on {describe_speculation(best.params)} ({why}): lookup drafts where it finds "
                f"a key, the draft model elsewhere",
            )
        )
    return state.first_new(candidates) or stack_length(state, best, chosen)


def start_match(state: SearchState) -> dict:
    """The knobs a trial at the start has: the baseline's hardware, temperature and experts."""
    hardware, temperature, experts = state.start()
    return {
        **hardware_params(hardware),
        **{k: v for k, v in (("temperature", temperature), ("experts", experts)) if state.knobs.has(k)},
    }


def sizes_alone(state: SearchState, params: dict) -> dict:
    """A lookup's sizes alone as a stack's: its key and hits, its K alone as the stacked length."""
    sizes = {k: params[k] for k in ("ngram_key", "ngram_min_hits") if k in params}
    if params.get("draft_max") is not None and state.knobs.has("lookup_max"):
        sizes["lookup_max"] = nearest(state.knobs.values("lookup_max"), params["draft_max"])
    if params.get("draft_min") is not None and state.knobs.has("lookup_min"):
        sizes["lookup_min"] = nearest(state.knobs.values("lookup_min"), params["draft_min"])
    return sizes


def stack_length(state: SearchState, draft: PastTrial, chosen: list[str]) -> Proposal | None:
    """The best stack's lookup length, doubled until the best is bracketed (its drafts cost only
    verification, so where copies are long its best length is far above the K it had alone); then the
    other stacked types at that length (their first trial, at a short length, may have hidden them)."""
    stacks = [
        r
        for r in state.measured(**state.params_for(option_of(draft.params), None, *state.start()))
        if is_stacked(r.params) and r.feasible
    ]
    best = max(stacks, key=lambda r: r.measured_value, default=None)
    if (
        best is None
        or best.measured_value < 0.95 * draft.measured_value
        or best.params.get("lookup_max") is None
    ):
        return None
    step = state.line_step(best.params, "lookup_max", grow=2.0)
    lengths = [r.params["lookup_max"] for r in stacks if r.params.get("lookup") == best.params["lookup"]]
    if step is not None and not min(lengths) < step < max(lengths):  # once bracketed, refinement narrows it
        return state.first_new(
            [
                (
                    {**best.params, "lookup_max": step},
                    "stacks",
                    f"lookup length {step}: line search around {best.params['lookup_max']} "
                    f"with {describe_speculation(best.params)}",
                )
            ]
        )
    return state.first_new(
        [
            (
                {**best.params, "lookup": t},
                "stacks",
                f"{t} in place of {best.params['lookup']} at the length found for it",
            )
            for t in chosen
            if t != best.params["lookup"]
        ]
    )


def gain_on(state: SearchState, trial: PastTrial, suites: list[str]) -> float:
    """A trial's geometric-mean speedup over the target alone on ``suites`` (pooled without suites)."""
    base = state.measured_baseline()
    if not suites or not trial.suites or not base.suites:
        return trial.measured_value / base.measured_value
    return math.exp(sum(math.log(trial.suites[s] / base.suites[s]) for s in suites) / len(suites))


def pays_on(state: SearchState, trial: PastTrial) -> list[str]:
    """The suites where a trial beat the target alone by LOOKUP_PAYS (the pooled rate without suites)."""
    base = state.measured_baseline()
    if not trial.suites or not base.suites:
        return ["the workload"] if trial.measured_value > LOOKUP_PAYS * base.measured_value else []
    return [
        s for s, rate in sorted(trial.suites.items()) if rate > LOOKUP_PAYS * base.suites.get(s, math.inf)
    ]
