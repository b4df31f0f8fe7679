"""Stage 2a, the hardware: NUMA policy, node and threads with the best speculation so far.

Threads and NUMA scale every configuration's decode rate by about the same factor, so they are tuned on
the speculative configuration rather than the target alone: the factor is about the same, the trial is
several times shorter, and a draft's cost grows with threads, so the pair is right for the configuration
that will be used. That configuration is the best reading, but at the K its option's fit ranks first among
those read within the noise of it (``model_pick``). In order:

1. the pair an earlier study found best on this host (``tuner.search.prior``; when it leads, the policy
   probes are skipped);
2. each NUMA policy at the baseline's threads (all physical cores), bind at one node's cores: a policy
   scales decode by up to a third, more than most thread counts do; with the host's copy probe, the first
   policy to probe is measured at its point and at all cores (``saturation_rung``) and the others at the
   better of the two;
3. the other nodes, when bind is best;
4. on the best policy, a coarse ladder of thread counts (``thread_ladder``: 3/4, 1/2 and 1/4 of the cores, and
   where the memory bandwidth saturates by the host's copy probe, ``tuner.machine.bandwidth``), nearest the
   best first and none past a count clearly below the best (``beyond_a_drop``); bind walks within one node's
   cores;
5. bracketing around the best rung (``bracket``): the wider gap beside it halved, until the gaps are within
   ``thread_step`` (adjacent counts on a big host differ by less than one launch's spread, so the walk never
   steps by one there) or the rungs beside it are within the noise of it (``LEVEL``: a flat stretch); SMT
   siblings once, where all cores lead and still gain (``still_gaining``).

The walk follows the best reading: a count within the noise of it (``SearchState.tie``: the spread of the
baseline's re-measures, at least ``evidence.THREAD_TIE``) is level with it, and which of two tied counts to deploy
is the race's to say (``tuner.decisions.race``: its resource rule takes fewer threads among the finalists within
its loss), not the walk's. Why: a walk that went on below the fewest threads tying with the best, and probed the
other policies there, came within 3% of the best later on drawn hosts (development draws 0-99: later in 36 replays
of 400, sooner in 5, the budget's end the same; docs/evidence/held-out-draws.md, "The thread walk follows the best
reading").

Why a ladder and not neighbours: on 1..96 threads a walk from 96 to the adjacent 95 measures noise; decode is
unimodal in threads (it gains until the memory bandwidth saturates, then loses to contention), so a coarse
ladder and a shrinking bracket find its top in a handful of trials where single steps took tens.
"""

from __future__ import annotations

from tuner.decisions.evidence import THREAD_TIE
from tuner.knobs.registry import SERVING_KNOBS
from tuner.search.history import PastTrial
from tuner.search.prior import HW_KNOBS, describe_prior
from tuner.search.stages.configs import (
    describe_speculation,
    hardware_of,
    hardware_params,
    is_stacked,
    nearest,
    option_of,
)
from tuner.search.stages.state import Proposal, SearchState

LADDER = (0.75, 0.5, 0.25)  # shares of the cores walked after all of them
# A gap beside the best is halved only when its far end is below the best by more than this, or the tie where
# the host's noise makes that wider: two standard deviations of the difference of two launches on a quiet host.
# The tie's floor is one, enough to pick (the race checks the pick), not to spend trials: the best of a ladder
# is the highest of several noisy readings and reads high (docs/decisions.md#thread-ties).
LEVEL = 2 * THREAD_TIE
STEP_SHARE = 1 / 16  # the finest step of the bracket, as a share of the cores (6 on 96 cores, 1 on 16)


def propose(state: SearchState) -> Proposal | None:
    """The prior's pair, then the policies not measured, the other nodes under bind, then the threads."""
    incumbent = incumbent_speculation(state)
    if incumbent is None or walked_another(state, incumbent):
        return None
    family = state.family(incumbent.params, *HW_KNOBS, "threads_batch")  # prompt threads follow the walk
    return (
        prior_pair(state, incumbent)
        or saturation_rung(state, incumbent, family)
        or policy_probes(state, incumbent, family)
        or bind_nodes(state, incumbent, family)
        or thread_walk(state, incumbent, family)
    )


def walked_another(state: SearchState, incumbent: PastTrial) -> bool:
    """Threads were walked already with another speculation (``walks``): the pair found there carries over in the
    incumbent's own knobs, as threads and NUMA scale every configuration alike, and refinement checks its
    neighbours with the final configuration; walking again for each new incumbent (another K after a line
    search) would spend a ladder per incumbent."""
    mine = _speculation(incumbent.params)
    return any(_speculation(dict(key)) != mine for key in walks(state))


def walks(state: SearchState) -> set[tuple]:
    """The configurations (all knobs but the thread counts, ``walk_key``) measured whole at three thread counts
    or more: a thread walk was done with each."""
    counts: dict[tuple, set] = {}
    for trial in state.trials:
        if trial.state == "complete" and trial.role not in ("baseline", "sentinel"):
            counts.setdefault(walk_key(trial.params), set()).add(trial.params.get("threads"))
    return {key for key, seen in counts.items() if len(seen) >= 3}


def walk_key(params: dict) -> tuple:
    """A configuration but its thread counts (decode and prompt): what a thread walk varies."""
    return tuple(sorted((k, v) for k, v in params.items() if k not in ("threads", "threads_batch")))


def _speculation(params: dict) -> tuple:
    """A configuration but its hardware knobs and prompt threads: what a thread walk is done with."""
    return tuple(sorted((k, v) for k, v in params.items() if k not in (*HW_KNOBS, "threads_batch")))


def incumbent_speculation(state: SearchState) -> PastTrial | None:
    """Best measured configuration at the baseline's temperature, experts and serving settings (any hardware):
    the hardware stage walks on it, and does not start again when the serving stage moves a knob."""
    _, temperature, experts = state.start()
    match = {k: v for k, v in (("temperature", temperature), ("experts", experts)) if state.knobs.has(k)}
    match.update({k: v for k, v in state.measured_baseline().params.items() if k in SERVING_KNOBS})
    best = state.best(state.measured(**match))
    return model_pick(state, best) if best is not None else None


def model_pick(state: SearchState, best: PastTrial) -> PastTrial:
    """At the start, of the best reading's option at the K measured there, the one its fit ranks first (the fit
    pools the option's launches), where its reading is within the noise of the best (``SearchState.close``):
    one launch reading high does not outvote the fit (docs/decisions.md, "The budget's end")."""
    start = state.start()
    option = option_of(best.params)
    if option is None or option[0] != "draft-simple" or is_stacked(best.params):
        return best  # a lookup's fit does not know the keys it misses (refinement keeps its measured K too)
    model = state.fit_option(option, start.temperature, start.experts)
    if model is None or len(model.points) < 2 or hardware_of(best.params) != start.hardware:
        return best
    others = {k: v for k, v in best.params.items() if k != "draft_max"}
    close = [
        r
        for r in state.measured(**others)
        if r.state == "complete"
        and r.feasible
        and set(r.params) == set(best.params)
        and r.measured_value >= (1 - state.close) * best.measured_value
    ]
    return max(close, key=lambda r: (model.predict(r.params["draft_max"]), r.measured_value), default=best)


# ------------------------------------------------------------------ the thread rules


def thread_step(cores: int) -> int:
    """The finest step of the bracket: ``STEP_SHARE`` of the cores, at least one."""
    return max(1, round(cores * STEP_SHARE))


def thread_ladder(values: list[int], cores: int, saturation: int | None = None) -> list[int]:
    """The coarse ladder: all ``cores``, the bandwidth probe's saturation point, 3/4, 1/2 and 1/4 of the cores,
    each the nearest value of the domain; a rung closer than a step to an earlier one is dropped."""
    below = [v for v in values if v <= cores] or values
    step = thread_step(cores)
    wanted = ([saturation] if saturation else []) + [cores * share for share in LADDER]
    ladder = [nearest(below, cores)]
    for target in wanted:
        value = nearest(below, round(target))
        if all(abs(value - rung) >= step for rung in ladder):
            ladder.append(value)
    return ladder


def walk_text(values: list[int], cores: int, saturation: int | None, nodes: int) -> str:
    """The thread walk a study will take, for `tuner run --check`."""
    if not values:
        return "threads: not searched"
    if len(values) == 1:
        return f"threads: {values[0]} (fixed)"
    start = (
        f"the policies at {nearest(values, saturation)} threads (the bandwidth probe), then "
        if saturation
        else ""
    )
    bind = f"; bind within one node's {cores // nodes} cores" if nodes > 1 else ""
    return (
        f"threads {min(values)}..{max(values)}: {start}the ladder "
        f"{', '.join(map(str, thread_ladder(values, cores, saturation)))} on the best policy, then the gap beside "
        f"the best halved down to {thread_step(cores)} thread(s) where its other end reads clearly below (beyond the "
        f"noise of the baseline's re-measures, at least {THREAD_TIE:.0%}){bind}"
    )


def best_count(points: dict[int, float]) -> int:
    """The thread count read highest."""
    return max(points, key=lambda t: points[t])


def bracket(points: dict[int, float], low: int, high: int, step: int, tie: float = THREAD_TIE) -> list[float]:
    """Thread counts to measure next around the best (the wider gap first).

    ``points``: threads -> rate on one policy (and node), ``low``..``high`` the range walked. A gap beside the best
    is halved while wider than ``step`` and its other end is clearly below the best (by more than ``LEVEL`` and
    the tie; one within that is a level stretch: a peak hidden in it is within the noise). Past an edge of the
    measured counts: half the lowest, or ``high`` once."""
    best = best_count(points)
    clearly_below = (1 - max(tie, LEVEL)) * points[best]
    wanted: list[tuple[float, float]] = []  # (priority: the gap's width, thread count)
    left, right = _neighbours(points, best)
    for side, edge in ((left, low), (right, high)):
        if side is None or points[side] < clearly_below:  # a side within the noise: level between
            wanted += _gap(side, best, edge, step)
    return [t for _, t in sorted(wanted, key=lambda w: -w[0])]


def still_gaining(points: dict[int, float], top: int, tie: float = THREAD_TIE) -> bool:
    """All ``top`` cores lead and the next fewer measured clearly below them: decode still gains threads at all
    cores, so SMT siblings may add more (where it is level there, they cannot)."""
    if max(points, key=lambda x: points[x]) != top:
        return False
    below = _neighbours(points, top)[0]
    return below is not None and points[below] < (1 - tie) * points[top]


def beyond_a_drop(points: dict[int, float], threads: int, tie: float = THREAD_TIE) -> bool:
    """A measured count lies between ``threads`` and the best and is clearly below the best (more than ``tie``):
    on a unimodal curve ``threads`` is lower still, so the ladder skips it."""
    if not points:
        return False
    best = max(points, key=lambda x: points[x])
    return any(
        min(threads, best) < m < max(threads, best) and points[m] < (1 - tie) * points[best] for m in points
    )


def _neighbours(points: dict[int, float], at: int) -> tuple[int | None, int | None]:
    below = [t for t in points if t < at]
    above = [t for t in points if t > at]
    return (max(below) if below else None), (min(above) if above else None)


def _gap(side: int | None, at: int, edge: int, step: int) -> list[tuple[float, float]]:
    """The midpoint of the gap between ``at`` and its measured neighbour ``side`` when wider than ``step``; past
    the last measured count, toward ``edge``: half of ``at`` below, ``edge`` itself above."""
    if side is None:
        if at == edge:
            return []
        return [(float("inf"), max(edge, at / 2) if edge < at else edge)]
    return [(abs(at - side), (at + side) / 2)] if abs(at - side) > step else []


# ------------------------------------------------------------------ the proposals


def _rest(incumbent: PastTrial) -> dict:
    """The incumbent's knobs but the hardware pair (prompt threads follow threads: ``space.FOLLOWS``)."""
    return {k: v for k, v in incumbent.params.items() if k not in (*HW_KNOBS, "threads_batch")}


def _node_cores(state: SearchState, cores: int) -> int:
    return max(1, cores // max(1, len(state.knobs.values("numa_node"))))


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


def saturation_rung(state: SearchState, incumbent: PastTrial, family: list[PastTrial]) -> Proposal | None:
    """The incumbent where the host's memory bandwidth saturates (its copy probe), then at all cores, on the first
    policy to probe (``rung_policy``): decode of a memory-bound model stops gaining there, so the other policies
    are compared at the better of the two. None without a probe or once the prior's policy leads."""
    values, cores = state.knobs.values("threads"), state.start().hardware.get("threads")
    if not state.saturation or not values or _prior_leads(state, family):
        return None
    hardware = rung_policy(state)
    measured = thread_points(family, hardware)
    return state.first_new(
        (
            {**_rest(incumbent), **hardware_params({**hardware, "threads": at})},
            "hardware",
            f"threads {at}: {why} with NUMA {hardware.get('numa')}, {describe_speculation(incumbent.params)}",
        )
        for at, why in (
            (
                nearest(values, state.saturation),
                "the host's memory bandwidth is near its peak from there (copy probe),",
            ),
            (cores, "all cores, against the copy probe's point,"),
        )
        if at is not None and at not in measured
    )


def rung_policy(state: SearchState) -> dict:
    """The baseline's hardware on the first policy other than its own that spans every node (not bind): the rung
    is measured on a policy still to probe, which may win, rather than on the baseline's, known at all cores
    already (measured there, the rung put every other policy one trial later); the baseline's own where the
    space has no other."""
    start = state.start().hardware
    other = next((p for p in state.knobs.values("numa") if p not in (start.get("numa"), "bind")), None)
    return {**start, "numa": other} if other is not None else start


def _prior_leads(state: SearchState, family: list[PastTrial]) -> bool:
    prior, best = state.prior.get("hardware") or {}, state.best(family)
    return bool(prior) and best is not None and best.params.get("numa") == prior.get("numa")


def policy_probes(state: SearchState, incumbent: PastTrial, family: list[PastTrial]) -> Proposal | None:
    """Each NUMA policy not measured with the incumbent, at the thread count read highest on the rung's policy
    (without a rung, on the baseline's); bind on the first node, at that count's share of one
    node's cores. None once the prior's policy leads (it carries over; threads are walked after)."""
    if _prior_leads(state, family):
        return None
    policies = {r.params.get("numa") for r in family}
    nodes, values = state.knobs.values("numa_node"), state.knobs.values("threads")
    start = state.start().hardware
    cores = start.get("threads")
    measured = thread_points(family, rung_policy(state)) or thread_points(family, start)
    threads = best_count(measured) if measured else cores
    candidates = []
    for policy in state.knobs.values("numa"):
        if policy in policies:
            continue
        bind = policy == "bind" and bool(nodes) and bool(values)
        if bind:
            assert threads is not None and cores is not None, (
                "a space with thread counts gives the baseline one"
            )
            at = nearest(values, max(1, round(threads * _node_cores(state, cores) / cores)))
        else:
            at = threads
        hardware = {"numa": policy, "threads": at, "numa_node": nodes[0] if bind else None}
        where = f" on node {nodes[0]} ({at} threads)" if bind else f" at {at} threads"
        candidates.append(
            (
                {**_rest(incumbent), **hardware_params(hardware)},
                "hardware",
                f"NUMA {policy}{where} with {describe_speculation(incumbent.params)}",
            )
        )
    return state.first_new(candidates)


def bind_nodes(state: SearchState, incumbent: PastTrial, family: list[PastTrial]) -> Proposal | None:
    """When bind is best: the other nodes, at its threads."""
    best = state.best(family)
    if best is None or best.params.get("numa") != "bind":
        return None
    hardware = hardware_of(best.params)
    bound = {r.params.get("numa_node") for r in family if r.params.get("numa") == "bind"}
    return state.first_new(
        [
            (
                {**_rest(incumbent), **hardware_params({**hardware, "numa_node": n})},
                "hardware",
                f"bind is best: node {n}",
            )
            for n in state.knobs.values("numa_node")
            if n not in bound
        ]
    )


def thread_walk(state: SearchState, incumbent: PastTrial, family: list[PastTrial]) -> Proposal | None:
    """On the best policy (and node): the ladder, then the bracket around its best (``bracket``)."""
    best = state.best(family)
    values = state.knobs.values("threads")
    if best is None or not values:
        return None
    hardware = hardware_of(best.params)
    cores = state.start().hardware.get("threads") or max(values)
    bind = hardware.get("numa") == "bind"
    top = _node_cores(state, cores) if bind else cores
    points = thread_points(family, hardware)
    if not points:
        return None
    saturation = state.saturation and max(1, round(state.saturation * top / cores))
    ladder = thread_ladder(values, top, saturation)
    within = {t: v for t, v in points.items() if t <= top}
    smt = [t for t in values if t > top]
    best_threads = best_count(within) if within else top
    rungs = [  # nearest the best first; none past a count clearly below the best (decode is unimodal in threads)
        (t, "ladder")
        for t in sorted(ladder, key=lambda t: (abs(t - best_threads), t))
        if not beyond_a_drop(within, t, state.tie)
    ]
    if within:
        rungs += [
            (nearest(values, round(t)), "bracket")
            for t in bracket(within, min(values), top, thread_step(top), state.tie)
        ]
    if smt and not bind and within and still_gaining(within, top, state.tie):
        rungs.append((max(smt), "smt"))  # all cores lead, clearly above fewer: SMT siblings once
    where = f"NUMA {hardware.get('numa')}" + (f" node {hardware.get('numa_node')}" if bind else "")
    return state.first_new(
        (
            {**_rest(incumbent), **hardware_params({**hardware, "threads": t})},
            "hardware",
            _reason(t, how, points, ladder, where, describe_speculation(incumbent.params)),
        )
        for t, how in rungs
        if t not in points
    )


def thread_points(family: list[PastTrial], hardware: dict) -> dict[int, float]:
    """Threads -> the best feasible rate measured whole on this policy and node (a pruned trial's partial rate
    is not comparable); empty where the space fixes the threads."""
    points: dict[int, float] = {}
    for trial in family:
        threads = trial.params.get("threads")
        if (
            trial.feasible
            and trial.state == "complete"
            and trial.params.get("numa") == hardware.get("numa")
            and trial.params.get("numa_node") == hardware.get("numa_node")
            and threads is not None
        ):
            points[threads] = max(points.get(threads, 0.0), trial.measured_value)
    return points


def _reason(
    threads: int, how: str, points: dict[int, float], ladder: list[int], where: str, spec: str
) -> str:
    if how == "ladder":
        return f"threads {threads}: the ladder ({', '.join(map(str, ladder))}) with {where}, {spec}"
    if how == "smt":
        return f"threads {threads}: SMT siblings, all physical cores leading, with {where}, {spec}"
    return f"threads {threads}: bracketing the best so far ({best_count(points)}) with {where}, {spec}"
