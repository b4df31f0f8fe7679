"""Stage 1d, the target's quantization (a study whose target lists ``quantize:``): each variant under the
best speculation so far, the target alone on the variant that leads, and K walked again there.

A coarser target reads fewer bytes a token, so on a memory-bound host it decodes faster; the draft then
costs relatively more and agrees less with the target, so the best K moves (usually down). So a variant is
a structural knob, like the draft: each is measured with the leading configuration, in the order the study
lists them; on the variant that leads, the target alone is measured (its own rate is what speculation is
measured against) and K is walked again by line search. A variant whose mean KL divergence from the source
is over ``quality.max_kld`` is infeasible in every configuration (speculation is lossless with respect to
its target), so one infeasible trial rules it out.
"""

from __future__ import annotations

from tuner.knobs.registry import SOURCE_QUANT
from tuner.search.stages.configs import option_of
from tuner.search.stages.experts import DRAFT_KNOBS
from tuner.search.stages.state import Proposal, SearchState

K_STEPS = 3  # K values measured on a leading variant beyond the one it was probed at


def propose(state: SearchState) -> Proposal | None:
    """The next variant under the incumbent's speculation, then the leading variant's base rate and K."""
    values = state.knobs.values("target_quant")
    incumbent = state.overall_best()
    at_source = state.best([r for r in state.trials if r.measured and source(r.params)])
    if len(values) < 2 or incumbent is None or at_source is None:
        return None
    ruled_out = ruled_out_variants(state)
    candidates = [
        (
            {**at_source.params, "target_quant": variant},
            "speculation",
            f"target {variant}: fewer bytes a token than the source, with the source's best speculation",
        )
        for variant in values
        if variant not in ruled_out and variant != SOURCE_QUANT
    ]
    leading = incumbent.params.get("target_quant", SOURCE_QUANT)
    if leading != SOURCE_QUANT:
        alone = {k: v for k, v in incumbent.params.items() if k not in DRAFT_KNOBS}
        candidates.append(
            (
                {**alone, "spec_type": "none"},
                "speculation",
                f"target {leading} alone: its own rate, K's baseline",
            )
        )
        candidates += k_walk(state, incumbent.params, leading)
    return state.first_new(candidates)


def source(params: dict) -> bool:
    return params.get("target_quant") in (None, SOURCE_QUANT)


def ruled_out_variants(state: SearchState) -> set:
    """Variants with a measured infeasible trial: over the KLD ceiling, whatever speculates on them."""
    return {
        r.params.get("target_quant")
        for r in state.trials
        if r.measured and not r.feasible and not source(r.params)
    }


def k_walk(state: SearchState, params: dict, variant: str) -> list[tuple]:
    """K's next line-search value on the leading variant, until ``K_STEPS`` values beyond the probe's were
    measured there."""
    if option_of(params) is None or not state.k_values or params.get("draft_max") is None:
        return []
    walked = {
        r.params.get("draft_max") for r in state.family(params) if r.params.get("draft_max") is not None
    }
    k = state.line_step(params, "draft_max")
    if k is None or len(walked) > K_STEPS:
        return []
    return [({**params, "draft_max": k}, "speculation", f"K={k} on target {variant}: its cost ratio moved K")]
