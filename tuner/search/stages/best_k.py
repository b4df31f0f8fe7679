"""Stage 1b, the speculation model and K: each option's predicted best K, measured.

Once every option is probed (``tuner.search.stages.probes``), each option's points at the baseline's
hardware, temperature and experts are fitted (``SearchState.fit_option``: acceptance and the draft/target
cost ratio of Leviathan et al.'s model, ``tuner.search.speedup_model``), and the predicted best K of the leading
options is measured, fitting again with each new point: the leader gets a few model-guided steps, a
runner-up within 3% one look at its predicted best. Options the model says do not pay are left alone;
where the model's pick lost to the probe, the line search of refinement takes over.
"""

from __future__ import annotations

from tuner.search.stages.configs import K_PROBE, nearest, option_name
from tuner.search.stages.state import Proposal, SearchState

LEADER_STEPS = 3  # measured points at the start (the probe included) for the leading option
RUNNER_UP_STEPS = 2  # for the others within 3% of it: the probe and one predicted best K
CLOSE = 0.97  # a runner-up this close to the leader's predicted speedup gets its look


def propose(state: SearchState) -> Proposal | None:
    """The predicted best K of the leading options (after the probes; nothing in a space without K)."""
    if not state.options() or not state.k_values:
        return None
    start = state.start()
    k_probe = nearest(state.k_values, K_PROBE)
    candidates = []
    ranked = ranked_options(state)
    for rank, (predicted, option, model, best_k) in enumerate(ranked):
        if predicted <= 1.0 or (rank > 0 and predicted < CLOSE * ranked[0][0]):
            continue
        mine = state.alone_at_start(option)
        if len(mine) >= (LEADER_STEPS if rank == 0 else RUNNER_UP_STEPS):
            continue
        if len(mine) >= 2 and max(mine, key=lambda r: r.measured_value).params.get("draft_max") == k_probe:
            continue  # the model's pick lost to the probe: the line search in refinement takes over
        candidates.append(
            (
                state.params_for(option, best_k, *start),
                "speculation",
                f"predicted best K={best_k} for {option_name(option)} from {model.describe()}: x{predicted:.2f}",
            )
        )
    return state.first_new(candidates)


def ranked_options(state: SearchState) -> list[tuple]:
    """(predicted speedup at the best K, option, fitted model, best K) for every fitted option, best first."""
    start = state.start()
    ranked = []
    for option in state.options():
        model = state.fit_option(option, start.temperature, start.experts)
        if model is not None:
            best_k = model.best_k(state.k_values)
            ranked.append((model.predict(best_k), option, model, best_k))
    ranked.sort(key=lambda x: -x[0])
    return ranked
