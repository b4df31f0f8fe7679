"""Stage 2b, prompt threads: ``threads_batch`` tuned apart from ``threads``, on prompt throughput.

Prompt processing is compute-bound and usually wants every physical core, where decode saturates earlier (the
memory bandwidth). llama.cpp runs prompts on as many threads as decode by default, so a host tuned to 60 decode
threads of 96 would process prompts on 60 cores. Where the space searches ``threads_batch`` (the study's long
prompts add it: ``tuner.prepare.fitted_space.long_prompts``), every plan leaves it to follow ``threads`` (llama.cpp's default,
``space.FOLLOWS``), and this stage measures the incumbent at every core too. llama.cpp also runs speculative
verification batches on the batch threads, so the sibling is a whole trial, decode included: the race keeps, of
siblings within reach of the leader on decode, the one with the better prompt tokens/s
(``tuner.decisions.race.prompt_pick``), and the export carries it.
"""

from __future__ import annotations

from tuner.search.stages.configs import describe_speculation, nearest
from tuner.search.stages.state import Proposal, SearchState


def propose(state: SearchState) -> Proposal | None:
    """The incumbent at prompt threads equal to its decode threads and at every core, whichever is missing."""
    values = state.knobs.values("threads_batch")
    incumbent = state.overall_best()
    if not values or incumbent is None or incumbent.params.get("threads") is None:
        return None
    cores = state.start().hardware.get("threads") or max(values)
    own = incumbent.params.get("threads_batch")
    wanted = [nearest(values, incumbent.params["threads"]), nearest(values, cores)]
    return state.first_new(
        (
            {**incumbent.params, "threads_batch": t},
            "hardware",
            f"prompt threads {t} (decode threads {incumbent.params['threads']}): prompt throughput compared at "
            f"{' and '.join(map(str, sorted(set(wanted))))}, with {describe_speculation(incumbent.params)}",
        )
        for t in wanted
        if t != own
    )
