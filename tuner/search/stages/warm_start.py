"""Stage 0, the warm start: the winner of an earlier study of the same target and workload on this host.

``tuner.search.prior`` found it when the study was created (and stored it with the study, so every worker
plans from the same one); it is tried right after the baseline. A prior that loses is simply outvoted by the
measurements that follow.
"""

from __future__ import annotations

from tuner.search.prior import describe_prior
from tuner.search.stages.state import Proposal, SearchState


def propose(state: SearchState) -> Proposal | None:
    """The earlier winner, once; nothing without a prior of the same target and workload."""
    params = state.prior.get("params")
    if not params:
        return None
    return state.first_new([(params, "warm start", f"the winner of {describe_prior(state.prior)}")])
