"""The structured search's planner: which stage proposes the next trial.

Why: an operator's space has thousands of configurations and a trial costs minutes, but it is not a black
box. Threads and NUMA scale every configuration's decode rate by about the same factor; tokens/s against K
is unimodal per draft; speculation has an analytic model (``tuner.search.speedup_model``) whose two numbers one
trial measures. TPE ignores all of it and needs several times the trials on such a space
(docs/decisions.md#tpe); the structured sampler (``tuner.search.structured_sampler``) plans each trial from
the study's history instead, in stages, each a module of ``tuner.search.stages`` asked in this order; the
first with something new to measure proposes it:

0. ``warm_start``: the winner of an earlier study of the same target and workload on this host.
1. ``probes``: every draft and n-gram type at K=8, at the baseline's hardware and temperature (but a draft
   whose weight bytes cap its speedup far below one measured).
   ``best_k``: the speculation model fitted per option, the predicted best K of the leading options.
   ``stacks``: lookup types stacked on the best draft-model configuration, and the stacked length.
   ``target_quant`` (a target with variants): each variant with the source's best speculation; on the
   variant that leads, the target alone and K walked again.
2. ``hardware``: NUMA policies, node and a walk over threads, with the best speculation so far.
   ``prompt_threads``: where prompts are long, ``threads_batch`` apart from ``threads``, on prompt throughput.
   ``serving`` (several users): slots at the objective's level, then each serving knob walked.
3. ``experts`` (a MoE target): the expert count walked down to the quality floor.
   ``temperature``: a walk over temperature from the best, and the best K predicted at each.
4. ``refinement``: the other options within the noise at their best K, at the final configuration, then the
   incumbent's neighbours.
5. ``tail``: with every stage ended, the one-step neighbours of the incumbent and of the contenders within the
   noise of it (threads halfway to the measured ones, temperature, K, NUMA policy, the other drafts).

The value maximised is the study's first objective (tokens/s per request, or with several users e.g.
``aggregate_tokens_per_second_c8``; a latency objective as its inverse, ``tuner.search.history``): where
speculation does not pay at the load, the probes measure that and no K is planned for it.

Layout: one module per stage, under ``tuner/search/stages/``, rather than one class, so a reader finds
"the stacks stage" by its file name and reads it alone; each stage is a function of ``SearchState`` (the
study's trials and space, ``stages/state.py``), which is built once per planned trial and never changes,
so the stages share no state but what was measured, and a stage is unit-tested by handing it a history.
A subpackage, not ``search/stage_*.py``: the nine stages and their two shared modules would otherwise
outnumber the rest of ``search/``. The order is a tuple here, the one place that says which stage comes
first.

The plan is a pure function of the stored trials (and the prior stored with the study), so any worker, or
a resumed study, computes the same next step.
"""

from __future__ import annotations

from tuner.search.history import PastTrial
from tuner.search.stages import (
    KnobValues,
    Proposal,
    SearchState,
    best_k,
    experts,
    hardware,
    probes,
    prompt_threads,
    refinement,
    serving,
    stacks,
    tail,
    target_quant,
    temperature,
    warm_start,
)
from tuner.storage.records import WarmStartPrior

STAGES = (
    warm_start,
    probes,
    best_k,
    stacks,
    target_quant,
    hardware,
    prompt_threads,
    serving,
    experts,
    temperature,
    refinement,
    tail,
)


def next_proposal(state: SearchState) -> Proposal | None:
    """The first stage's proposal, in ``STAGES`` order; None before a baseline or when no stage has one."""
    if state.baseline is None:
        return None
    for stage in STAGES:
        proposal = stage.propose(state)
        if proposal is not None:
            return proposal
    return None


def plan(
    space: dict[str, list],
    trials: list[PastTrial],
    prior: WarmStartPrior | None = None,
    users: int | None = None,
    saturation: int | None = None,
    draft_shares: dict[str, float] | None = None,
) -> Proposal | None:
    """The next trial for a study with this space (``ResolvedSpace.as_dict``) and history;
    ``saturation``: where the host's memory bandwidth saturates (``tuner.machine.bandwidth``);
    ``draft_shares``: each dense draft's weight bytes over the target's (``speedup_model.draft_byte_shares``)."""
    return next_proposal(SearchState(KnobValues(space), trials, prior, users, saturation, draft_shares))
