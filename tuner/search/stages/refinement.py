"""Stage 4, refinement: the other options close to the incumbent, then its unmeasured neighbours.

The other options within the noise of the incumbent's (``SearchState.close``) at their best K (predicted, or measured where the model's
pick lost, as for lookup types, whose missed keys the model does not know); then the neighbours of the
incumbent: threads (the hardware pair checked again with the final configuration), experts, and line searches
over K, a stacked lookup's length, the n-gram key and minimum hits. When nothing is left, the fallback
sampler proposes.
"""

from __future__ import annotations

from tuner.search.stages.configs import describe_speculation, option_name, option_of
from tuner.search.stages.hardware import thread_step, walk_key, walks
from tuner.search.stages.state import Proposal, SearchState


def propose(state: SearchState) -> Proposal | None:
    """Unmeasured neighbours of the incumbent; other options at their best K (predicted, or measured
    where the model's pick lost), before the hardware pair is checked again."""
    incumbent = state.overall_best()
    if incumbent is None:
        return None
    params = incumbent.params
    draft_max = params.get("draft_max")
    candidates = other_options(state, params) if draft_max is not None else []
    candidates += neighbours(state, params)
    if draft_max is not None and state.k_values:
        step = state.line_step(params)
        if step is not None:
            candidates.append(
                (
                    {**params, "draft_max": step},
                    "refinement",
                    f"K={step}: line search around the best K={draft_max} (tokens/s is unimodal in K)",
                )
            )
    return state.first_new(candidates + size_steps(state, params))


def neighbours(state: SearchState, params: dict) -> list[tuple]:
    """The incumbent a bracket step (``hardware.thread_step``) from its thread count, and at the expert counts
    next to its own."""
    candidates = []
    threads = state.knobs.values("threads")
    own = params.get("threads")
    if (
        own is not None and own in threads and walk_key(params) not in walks(state)
    ):  # a walk's bracket stands: no noise chased
        step = thread_step(state.start().hardware.get("threads") or max(threads))
        lower = max((t for t in threads if t <= own - step), default=None)
        cores = state.start().hardware.get("threads") or max(threads)  # SMT siblings: the hardware stage's
        upper = min((t for t in threads if t >= own + step and (t <= cores or own > cores)), default=None)
        for thread_count in (lower, upper):
            if thread_count is not None and not checked(state, params, thread_count):
                rest = {k: v for k, v in params.items() if k != "threads_batch"}  # follows threads (FOLLOWS)
                candidates.append(
                    (
                        {**rest, "threads": thread_count},
                        "refinement",
                        f"threads {thread_count} with the final configuration (the pair checked again)",
                    )
                )
    experts = state.knobs.values("experts")
    if params.get("experts") in experts:
        for count in (params["experts"] - 1, params["experts"] + 1):
            if count in experts:
                candidates.append(
                    ({**params, "experts": count}, "refinement", f"experts {count} next to the best")
                )
    return candidates


def checked(state: SearchState, params: dict, threads: int) -> bool:
    """The thread count was measured with the configuration's option at its temperature and NUMA policy, at any K
    or n-gram sizes: the check of the pair with the final configuration is done once per count, not again for
    each new incumbent that differs in K alone. Why: on development draws 0-39 each K or key the line search
    found (often by one launch reading high) checked its thread neighbours again, and each reading high walked
    the threads a step further (draw 8 seed 0: six such checks between 16 and 24 threads, within 3% of each
    other)."""
    return any(r.params.get("threads") == threads for r in state.family(params, "threads", "threads_batch"))


def other_options(state: SearchState, params: dict) -> list[tuple]:
    """The other options within the noise of the incumbent's at the start (``SearchState.close``), with the
    incumbent's other knobs: the final hardware decides between them."""
    option = option_of(params)
    start = state.start()
    incumbent_model = state.fit_option(option, start.temperature, start.experts) if option else None
    candidates = []
    for other in state.options():
        model = state.fit_option(other, start.temperature, start.experts)
        if other == option or model is None or incumbent_model is None:
            continue
        assert option is not None, "the incumbent's model is fitted only where it speculates"
        best_k, why = model.best_k(state.k_values), "predicted"
        theirs, ours = state.alone_at_start(other), state.alone_at_start(option)
        # none at the start: fitted from trials elsewhere (a draft the probes left out, sampled later)
        top = max(theirs, key=lambda r: r.measured_value, default=None)
        tried = {r.params.get("draft_max") for r in theirs}
        if (
            top is not None
            and len(tried) > 1
            and top.params.get("draft_max") != best_k
            and (best_k in tried or other[0] != "draft-simple")
        ):
            best_k, why = (
                top.params["draft_max"],
                "measured",
            )  # the model's pick lost where measured (a lookup's also unmeasured: it misses some keys the model
            # does not know); a draft's pick not measured yet stands: its refit saw the one it measured read low
        close = 1 - state.close
        if model.predict(best_k) >= close * incumbent_model.predict(
            incumbent_model.best_k(state.k_values)
        ) or (
            why == "measured"
            and top
            and ours
            and top.measured_value >= close * max(r.measured_value for r in ours)
        ):
            rest = {x: v for x, v in params.items() if x not in ("spec_type", "draft", "draft_max")}
            candidates.append(
                (
                    {**rest, **state.params_for(other, best_k, {}, None, None)},
                    "refinement",
                    f"{option_name(other)} at its {why} best K={best_k}: {why} within {state.close:.0%}",
                )
            )
    return candidates


def size_steps(state: SearchState, params: dict) -> list[tuple]:
    """Line searches over the n-gram sizes of the incumbent's lookup (alone or stacked)."""
    steps = []
    for knob, what in (
        ("lookup_max", "the stacked lookup's draft length"),
        ("ngram_key", "the n-gram key length"),
        ("ngram_min_hits", "the n-gram minimum hits"),
    ):
        step = state.line_step(params, knob) if params.get(knob) is not None else None
        if step is not None:
            steps.append(
                (
                    {**params, knob: step},
                    "refinement",
                    f"{what} {step}: line search around the best {params[knob]} with {describe_speculation(params)}",
                )
            )
    return steps
