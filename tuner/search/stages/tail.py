"""Stage 5, the tail: once every structured stage has ended, the trials left go to what can still change the answer.

Why: a study's budget rarely ends with its structured stages, and the fallback sampler proposes far from the
incumbent (TPE's proposals measured at a third to half of it), where a few percent are still to be had next to
it: a thread count between two measured ones, the temperature one step away, K one rung either way, the other
NUMA policies, the other draft models at the incumbent's settings. So the tail measures, for the incumbent and
then each contender measured within the noise of it (``SearchState.close``), best first, its one-step neighbours
not measured yet; a neighbour that reads higher becomes the incumbent and its own neighbours come next. Only when
none is left does the fallback propose.
"""

from __future__ import annotations

from tuner.search.history import PastTrial
from tuner.search.stages.configs import nearest, option_of
from tuner.search.stages.state import Proposal, SearchState
from tuner.search.stages.temperature import first_infeasible, walked

STAGE = "tail"
# thread gaps narrower than this are left: decode is level within the noise across a few threads
MIN_THREAD_GAP, THREAD_GAP_SHARE = 4, 0.1


def propose(state: SearchState) -> Proposal | None:
    """The first unmeasured one-step neighbour of the incumbent, then of each contender within the noise."""
    best = state.overall_best()
    if best is None:
        return None
    floor = (1 - state.close) * best.measured_value
    contenders = sorted(
        (
            r
            for r in state.trials
            if r.measured and r.feasible and r.state == "complete" and r.measured_value >= floor
        ),
        key=lambda r: -r.measured_value,
    )
    candidates: list[tuple] = []
    for trial in [best, *(r for r in contenders if r is not best)]:
        candidates += one_step(state, trial)
    return state.first_new(candidates)


def one_step(state: SearchState, trial: PastTrial) -> list[tuple]:
    """A trial's neighbours: the temperature one step either way (below the first infeasible one), K one rung
    either way, the other NUMA policies at its threads (and across bind), threads halfway to the nearest measured
    count either side, the other draft models at its K. Why the policies before the thread halves: a policy moves
    decode by up to 15% on drawn hosts, a half step beside a walked thread count by a few percent; on development
    draws 0-99 (4 seeds, readings keyed by configuration) this order came within 3% sooner in 32 replays and later
    in 14 (docs/decisions.md, "Held-out draws")."""
    params = trial.params
    return [
        *temperature_steps(state, params),
        *k_steps(state, params),
        *numa_steps(state, params),
        *thread_halves(state, params),
        *draft_steps(state, params),
    ]


def thread_halves(state: SearchState, params: dict) -> list[tuple]:
    """Halfway from the trial's thread count to the nearest measured one either side at its other knobs (to
    the host's first or last count when none is measured that side), within the physical cores unless it is
    above, where the gap is at least ``MIN_THREAD_GAP`` threads and ``THREAD_GAP_SHARE`` of its own."""
    threads, own = state.knobs.values("threads"), params.get("threads")
    if own is None or own not in threads:
        return []
    rest = {k: v for k, v in params.items() if k not in ("threads", "threads_batch")}
    measured = {r.params["threads"] for r in state.measured(**rest) if r.params.get("threads") is not None}
    cores = state.start().hardware.get("threads") or max(threads)
    top = max(threads) if own > cores else cores
    lower = max((t for t in measured if t < own), default=min(threads))
    upper = min((t for t in measured if t > own), default=top)
    steps = []
    for other in (lower, upper):
        half = nearest(threads, (own + other) / 2)
        if abs(other - own) >= max(MIN_THREAD_GAP, own * THREAD_GAP_SHARE) and half != own and half <= top:
            steps.append(
                (
                    {**rest, "threads": half},
                    STAGE,
                    f"threads {half}: halfway to {other} from the best's {own}",
                )
            )
    return steps


def temperature_steps(state: SearchState, params: dict) -> list[tuple]:
    """The temperatures next to the trial's, below the first one measured below the quality floor, but those that
    lost clearly to the trial's own at the same other knobs and any K (``temperature.walked``, the temperature
    stage's rule: each new incumbent in the tail, another K or thread count, walked them again)."""
    temperatures = sorted(state.knobs.values("temperature"))
    own = params.get("temperature")
    if own not in temperatures or len(temperatures) < 2:
        return []
    hot = first_infeasible(state, params)
    at = temperatures.index(own)
    lost = walked(state, params)
    return [
        ({**params, "temperature": t}, STAGE, f"temperature {t} next to the best's {own}")
        for t in temperatures[max(0, at - 1) : at + 2]
        if t != own and t < hot and t not in lost
    ]


def k_steps(state: SearchState, params: dict) -> list[tuple]:
    """K one rung either way of the trial's."""
    own, values = params.get("draft_max"), state.k_values
    if own is None or own not in values:
        return []
    at = values.index(own)
    return [
        ({**params, "draft_max": k}, STAGE, f"K={k} one rung from the best's K={own}")
        for k in values[max(0, at - 1) : at + 2]
        if k != own
    ]


def numa_steps(state: SearchState, params: dict) -> list[tuple]:
    """The other NUMA policies that spread over the host, at the trial's threads (under bind: the other
    nodes), then across the bind line (``across_bind``)."""
    own = params.get("numa")
    if own is None:
        return []
    if own == "bind":
        return [
            (
                {**params, "numa_node": node},
                STAGE,
                f"NUMA node {node} next to the best's {params.get('numa_node')}",
            )
            for node in state.knobs.values("numa_node")
            if node != params.get("numa_node")
        ] + across_bind(state, params)
    rest = {k: v for k, v in params.items() if k != "numa_node"}
    return [
        ({**rest, "numa": policy}, STAGE, f"NUMA {policy} at the best's threads")
        for policy in state.knobs.values("numa")
        if policy not in (own, "bind")
    ] + across_bind(state, params)


def across_bind(state: SearchState, params: dict) -> list[tuple]:
    """Under bind, the policies that spread over the host at its threads times the nodes; under one of those,
    bind at its threads over the nodes, on the node read best under bind. Why: bind runs one node's share of
    the host, so its best thread count is about the host's best over the nodes, and the hardware stage walks
    the threads on the one policy leading at the probes' counts only; on development draws 0-39 the seeds that
    walked bind (6 threads of 64 cores, 16 threads of 96) missed a host-wide policy at 24 to 53 threads by 4 to
    12%, which no step at bind's own thread count reaches."""
    threads, nodes = state.knobs.values("threads"), state.knobs.values("numa_node")
    own, policy = params.get("threads"), params.get("numa")
    if own is None or not threads or len(nodes) < 2 or "bind" not in state.knobs.values("numa"):
        return []
    cores = state.start().hardware.get("threads") or max(threads)
    rest = {k: v for k, v in params.items() if k not in ("numa", "numa_node", "threads", "threads_batch")}
    if policy == "bind":
        at = nearest([t for t in threads if t <= cores] or threads, own * len(nodes))
        return [
            (
                {**rest, "numa": other, "threads": at},
                STAGE,
                f"NUMA {other} at {at} threads: bind's {own} per node",
            )
            for other in state.knobs.values("numa")
            if other != "bind"
        ]
    bound = [r for r in state.measured(numa="bind") if r.feasible and r.state == "complete"]
    node = max(bound, key=lambda r: r.measured_value).params.get("numa_node") if bound else nodes[0]
    at = nearest(threads, max(1, round(own / len(nodes))))
    return [
        (
            {**rest, "numa": "bind", "numa_node": node, "threads": at},
            STAGE,
            f"NUMA bind on node {node} at {at} threads: the best's {own} over {len(nodes)} nodes",
        )
    ]


def draft_steps(state: SearchState, params: dict) -> list[tuple]:
    """The other draft models at the trial's settings and K (a draft of one size in another quantization reads
    within a few percent of it)."""
    option = option_of(params)
    if option is None or option[0] != "draft-simple":
        return []
    return [
        ({**params, "draft": draft}, STAGE, f"draft {draft} at the best's settings and K")
        for draft in state.knobs.values("draft")
        if draft != params.get("draft")
    ]
