"""Stage 2, the hardware: NUMA policy, node and threads with the best speculation so far.

Threads and NUMA scale every configuration's decode rate by about the same factor, so they are tuned on
the speculative configuration rather than the target alone: the factor is about the same, the trial is
several times shorter, and a draft's cost grows with threads, so the pair is right for the configuration
that will be used. In order: the pair an earlier study found best on this host (``tuner.search.prior``; when
it leads, the policy probes are skipped), each NUMA policy at the baseline's threads, the other nodes when
bind is best, then a unimodal walk over thread counts on the best policy.
"""

from __future__ import annotations

from tuner.knobs.registry import SERVING_KNOBS
from tuner.search.history import PastTrial
from tuner.search.prior import HW_KNOBS, describe_prior
from tuner.search.stages.configs import describe_speculation, hardware_of, hardware_params
from tuner.search.stages.state import Proposal, SearchState


def propose(state: SearchState) -> Proposal | None:
    """The prior's pair, then the policies not measured, then the node and threads around the best."""
    incumbent = incumbent_speculation(state)
    if incumbent is None:
        return None
    family = state.family(incumbent.params, *HW_KNOBS)
    return (
        prior_pair(state, incumbent)
        or policy_probes(state, incumbent, family)
        or placement_walk(state, incumbent, family)
    )


def incumbent_speculation(state: SearchState) -> PastTrial | None:
    """Best measured configuration at the baseline's temperature, experts and serving settings (any hardware):
    the hardware stage walks on it, and does not start again when the serving stage moves a knob."""
    _, temperature, experts = state.start()
    match = {k: v for k, v in (("temperature", temperature), ("experts", experts)) if state.knobs.has(k)}
    match.update({k: v for k, v in state.baseline.params.items() if k in SERVING_KNOBS})
    return state.best(state.measured(**match))


def _rest(incumbent: PastTrial) -> dict:
    """The incumbent's knobs but the hardware pair."""
    return {k: v for k, v in incumbent.params.items() if k not in HW_KNOBS}


def prior_pair(state: SearchState, incumbent: PastTrial) -> Proposal | None:
    """The NUMA policy and threads an earlier study on this host found best, with the incumbent."""
    prior = state.prior.get("hardware")
    if not prior:
        return None
    return state.first_new(
        [
            (
                {**_rest(incumbent), **hardware_params(prior)},
                "hardware",
                f"NUMA {prior.get('numa')}, {prior.get('threads')} threads with "
                f"{describe_speculation(incumbent.params)}: best on this host in {describe_prior(state.prior)}",
            )
        ]
    )


def policy_probes(state: SearchState, incumbent: PastTrial, family: list[PastTrial]) -> Proposal | None:
    """Each NUMA policy not measured with the incumbent, at the baseline's threads (bind: the first node);
    none once the prior's policy leads (it carries over; threads are walked after)."""
    prior = state.prior.get("hardware")
    best = state.best(family)
    if prior and best is not None and best.params.get("numa") == prior.get("numa"):
        return None
    policies = {r.params.get("numa") for r in family}
    nodes = state.knobs.values("numa_node")
    threads = state.start().hardware.get("threads")
    candidates = []
    for policy in state.knobs.values("numa"):
        if policy not in policies:
            hardware = {
                "numa": policy,
                "threads": threads,
                "numa_node": nodes[0] if policy == "bind" and nodes else None,
            }
            candidates.append(
                (
                    {**_rest(incumbent), **hardware_params(hardware)},
                    "hardware",
                    f"NUMA {policy} with {describe_speculation(incumbent.params)}",
                )
            )
    return state.first_new(candidates)


def placement_walk(state: SearchState, incumbent: PastTrial, family: list[PastTrial]) -> Proposal | None:
    """On the best policy: the other nodes when bind is best, then the thread counts next to the best."""
    best = state.best(family)
    if best is None:
        return None
    rest, hardware = _rest(incumbent), hardware_of(best.params)
    candidates = []
    if hardware.get("numa") == "bind":
        bound = {r.params.get("numa_node") for r in family if r.params.get("numa") == "bind"}
        candidates += [
            ({**rest, **hardware_params({**hardware, "numa_node": n})}, "hardware", f"bind is best: node {n}")
            for n in state.knobs.values("numa_node")
            if n not in bound
        ]
    threads = state.knobs.values("threads")
    walked = {
        r.params.get("threads")
        for r in family
        if r.params.get("numa") == hardware.get("numa")
        and r.params.get("numa_node") == hardware.get("numa_node")
    }
    if hardware.get("threads") in threads:
        i = threads.index(hardware["threads"])
        for j in (i - 1, i + 1):
            if 0 <= j < len(threads) and threads[j] not in walked:
                candidates.append(
                    (
                        {**rest, **hardware_params({**hardware, "threads": threads[j]})},
                        "hardware",
                        f"threads {threads[j]} next to the best so far ({hardware['threads']}) "
                        f"with NUMA {hardware.get('numa')}, {describe_speculation(incumbent.params)}",
                    )
                )
    return state.first_new(candidates)
