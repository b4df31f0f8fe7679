"""Stage 1a, the probes: every option (each draft model, each n-gram type) measured once at K=8.

At the baseline's hardware, temperature and experts, each option not yet measured alone there is probed at
the research's starting K (``K_PROBE``; an n-gram key of 4 tokens): one trial gives the two numbers of its
speculation model (acceptance and draft cost, ``tuner.search.speedup_model``), which the next stage
(``tuner.search.stages.best_k``) fits. Options that failed for a permanent reason are not probed again, nor
a draft whose weight bytes put its best speedup far below one already measured (``SearchState.beyond_reach``:
a 12 GB self-draft of a 19 GB target reached x0.63 in the research, where its 0.5B draft reached x10).
"""

from __future__ import annotations

from tuner.search.stages.configs import K_PROBE, nearest, option_name
from tuner.search.stages.state import Proposal, SearchState


def propose(state: SearchState) -> Proposal | None:
    """The first option not measured alone at the start, at K=8 (the nearest K the space has)."""
    options = state.options()
    if not options:
        return None
    start = state.start()
    k_probe = nearest(state.k_values, K_PROBE) if state.k_values else None
    return state.first_new(
        (
            state.params_for(option, k_probe, *start),
            "speculation",
            f"probe {option_name(option)} at K={k_probe}: fit its acceptance and draft cost",
        )
        for option in options
        if not state.alone_at_start(option) and state.beyond_reach(option) is None
    )


def passed_over(state: SearchState) -> list[str]:
    """Why each option not probed at the start is left out (``SearchState.beyond_reach``), for the report."""
    return [
        why
        for option in state.options()
        if not state.alone_at_start(option) and (why := state.beyond_reach(option)) is not None
    ]
