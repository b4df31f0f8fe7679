"""The stages of the structured search, one module each, in the order ``tuner.search.planner`` asks them:
``warm_start``, ``probes``, ``best_k`` (the speculation model and K), ``stacks``, ``target_quant``, ``hardware``,
``prompt_threads``, ``serving``,
``experts``, ``temperature``, ``refinement``, ``tail``. Each offers ``propose(state) -> Proposal | None``; what
they all read is ``state.SearchState`` (the study's trials and space), and ``configs`` builds and names plans.
The package offers the three the planner takes (``KnobValues``, ``Proposal``, ``SearchState``).
"""

from tuner.search.stages.configs import KnobValues
from tuner.search.stages.state import Proposal, SearchState

__all__ = ["KnobValues", "Proposal", "SearchState"]
