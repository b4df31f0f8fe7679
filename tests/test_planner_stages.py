"""The structured search's stages one by one, on hand-written histories (no study, no replay).

Each stage module of ``tuner.search.stages`` is handed a ``SearchState`` built from a few ``PastTrial``s
and asked for its proposal: what it proposes first, and when it has nothing to propose. The whole
sampler on simulated studies is tests/test_search.py's.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest

from tuner.measurement.failures import FailureReason
from tuner.search import planner
from tuner.search.history import PastTrial
from tuner.search.speedup_model import (
    Point,
    byte_ceiling,
    draft_byte_shares,
    fit,
    measured_acceptance,
    speedup,
)
from tuner.search.stages import (
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
from tuner.search.stages.configs import KnobValues, describe_speculation, option_of
from tuner.search.stages.state import SearchState

SPACE = {
    "spec_type": ["Choices", {"values": ["none", "draft-simple", "ngram-simple"]}],
    "draft": ["Choices", {"values": ["small"]}],
    "draft_max": ["IntRange", {"low": 1, "high": 32, "step": 1, "log": False}],
    "temperature": ["Choices", {"values": [0.0, 0.5, 1.0]}],
    "numa": ["Choices", {"values": ["none", "interleave"]}],
    "threads": ["IntRange", {"low": 8, "high": 32, "step": 8, "log": False}],
}
STACK_SPACE = {
    **SPACE,
    "lookup": ["Choices", {"values": ["none", "ngram-simple"]}],
    "lookup_max": ["IntRange", {"low": 1, "high": 64, "step": 1, "log": False}],
}
START = {"temperature": 0.0, "numa": "none", "threads": 16}
BASE = {"spec_type": "none", **START}
DRAFT = {"spec_type": "draft-simple", "draft": "small", "draft_max": 8, **START}
NGRAM = {"spec_type": "ngram-simple", "draft_max": 8, **START}


def past(params: dict, value: float, acceptance: float | None = None, **fields) -> PastTrial:
    """A completed, feasible trial unless ``fields`` say otherwise."""
    defaults = dict(state="complete", feasible=True, failure=None, role="search", suites={})
    return PastTrial(dict(params), value=value, acceptance=acceptance, **{**defaults, **fields})


def baseline(value: float = 10.0, **params) -> PastTrial:
    return past({**BASE, **params}, value, role="baseline")


def drafted(a: float, c: float, k: int = 8, base: float = 10.0, **params) -> PastTrial:
    """A speculative trial whose rate and acceptance follow the model at acceptance ``a`` and cost ``c``."""
    return past({**DRAFT, "draft_max": k, **params}, base * speedup(a, c, k), measured_acceptance(a, k))


def state_of(*trials: PastTrial, space: dict | None = None, **kwargs) -> SearchState:
    return SearchState(KnobValues(space or SPACE), list(trials), **kwargs)


def test_a_baseline_read_on_a_busy_host_gives_way_to_its_first_quiet_re_measure():
    """The stages compare with the target alone: a busy baseline (a fifth of its rate beside CPU hogs) would make
    every lookup pay on every suite; its first quiet sentinel stands for it, and a busy one never does."""
    busy = past(BASE, 2.0, role="baseline", busy=True)
    lookup = past(NGRAM, 11.0)
    late_busy = past(BASE, 3.0, role="sentinel", busy=True)
    quiet = past(BASE, 10.0, role="sentinel")
    assert state_of(busy, lookup, late_busy, quiet).measured_baseline() is quiet
    assert state_of(busy, lookup, late_busy).measured_baseline() is busy  # no quiet reading yet: as measured
    assert state_of(past(BASE, 10.0, role="baseline"), lookup, quiet).measured_baseline().role == "baseline"


# -- the planner -------------------------------------------------------------------------------


def test_the_planner_asks_the_stages_in_order_and_takes_the_first_proposal(monkeypatch):
    asked = []

    def stage(name, answer=None):
        return SimpleNamespace(propose=lambda state: asked.append(name) or answer)

    monkeypatch.setattr(planner, "STAGES", (stage("a"), stage("b", "from b"), stage("c", "from c")))
    assert planner.next_proposal(state_of(baseline())) == "from b" and asked == ["a", "b"]
    assert planner.next_proposal(state_of()) is None  # nothing planned before a baseline is measured


def test_every_stage_is_a_documented_module_in_the_search_order():
    assert planner.STAGES == (
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
    for stage in planner.STAGES:
        assert stage.__doc__ and stage.propose.__doc__, stage.__name__
    # each module's docstring opens with its label ("Stage 1b, ..."): one label a stage, in the search order
    labels = [stage.__doc__.split(",")[0] for stage in planner.STAGES]
    assert all(label.startswith("Stage ") for label in labels), labels
    assert labels == sorted(set(labels)), labels


def test_plan_reads_the_space_as_the_study_record_keeps_it():
    proposal = planner.plan(SPACE, [baseline()])
    assert proposal.stage == "speculation" and proposal.params == DRAFT


# -- what every stage reads ------------------------------------------------------------------------


def test_knob_values_walk_choices_steps_and_a_few_points_of_a_float_range():
    knobs = KnobValues(
        {
            **SPACE,
            "ubatch": ["IntRange", {"low": 1, "high": 4096, "step": 1, "log": True}],
            "draft_p_min": ["FloatRange", {"low": 0.0, "high": 1.0, "step": None, "log": False}],
        }
    )
    assert knobs.values("threads") == [8, 16, 24, 32] and knobs.values("temperature") == [0.0, 0.5, 1.0]
    assert len(knobs.values("ubatch")) == 17 and knobs.values("ubatch")[-1] == 4096  # log-spaced
    assert knobs.values("draft_p_min") == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert knobs.values("experts") == [] and not knobs.has("experts")


def test_a_plan_is_completed_with_exactly_the_knobs_a_trial_of_it_asks():
    state = state_of(baseline())
    assert state.complete({"spec_type": "none", "draft_max": 4, **START}) == BASE  # no K without speculation
    # a knob the plan leaves open is asked at its probe value, or left to the fallback sampler (no probe K)
    assert "draft_max" not in state.complete({"spec_type": "draft-simple", "draft": "small", **START})
    stack_space = state_of(baseline(), space=STACK_SPACE)
    assert stack_space.complete(DRAFT) == {**DRAFT, "lookup": "none"}  # no lookup stacked unless planned
    assert "threads" not in state.complete({**DRAFT, "threads": 12})  # outside the domain: the fallback's


def test_the_line_search_extends_past_an_edge_then_halves_the_wider_gap():
    k8 = drafted(0.8, 0.05, 8)
    state = state_of(baseline(), k8)
    assert state.line_step(DRAFT) == 12  # past the unmeasured upper edge by 1.5
    state = state_of(
        baseline(), k8, past({**DRAFT, "draft_max": 12}, 1.0), past({**DRAFT, "draft_max": 5}, 1.0)
    )
    assert state.line_step(DRAFT) == 10  # between 8 and 12 (the wider gap), not 6 or 7


def test_options_blamed_for_a_permanent_failure_are_dropped():
    failed = past(NGRAM, None, state="failed", failure=FailureReason.LAUNCH_FAILED.value)
    assert state_of(baseline(), failed).options() == [("draft-simple", "small")]
    retried = past(NGRAM, None, state="failed", failure="timeout")
    assert ("ngram-simple", None) in state_of(baseline(), retried).options()


def test_describe_speculation_names_a_stack_and_its_sizes():
    params = {**DRAFT, "draft_max": 24, "lookup": "ngram-mod", "ngram_key": 4, "lookup_max": 32}
    assert describe_speculation(params) == "draft small K=24 + ngram-mod (key 4, lookup max 32)"
    assert describe_speculation(BASE) == "the target alone" and option_of(BASE) is None


# -- stage 0 and 1: warm start, probes, the model's K -----------------------------------------------


def test_warm_start_tries_the_earlier_winner_once():
    prior = {
        "params": DRAFT,
        "study": "old",
        "trial": 3,
        "tokens_per_second": 20.0,
        "same_target": True,
        "same_workload": True,
    }
    proposal = warm_start.propose(state_of(baseline(), prior=prior))
    assert proposal.stage == "warm start" and proposal.params == DRAFT and "study old" in proposal.reason
    assert warm_start.propose(state_of(baseline(), past(DRAFT, 20.0), prior=prior)) is None
    assert warm_start.propose(state_of(baseline())) is None


def test_probes_measure_each_option_once_at_k8_at_the_start():
    first = probes.propose(state_of(baseline()))
    assert first.params == DRAFT and first.reason.startswith("probe draft small at K=8")
    second = probes.propose(state_of(baseline(), drafted(0.8, 0.05)))
    assert second.params == NGRAM
    elsewhere = drafted(0.8, 0.05, threads=32)  # measured at other hardware: not the start's probe
    assert probes.propose(state_of(baseline(), elsewhere)).params == DRAFT
    assert probes.propose(state_of(baseline(), drafted(0.8, 0.05), past(NGRAM, 9.0, 0.1))) is None


def test_a_draft_whose_bytes_cap_it_far_below_a_measured_speedup_is_not_probed():
    space = {**SPACE, "draft": ["Choices", {"values": ["small", "self-q2"]}]}
    big = {**DRAFT, "draft": "self-q2"}
    fast = drafted(0.95, 0.03)  # x6.0 at K=8
    shares = {"small": 0.03, "self-q2": 0.6}  # self-q2: at most x1.7 at any K
    assert fast.value / 10.0 > 2 * (1 / 0.6)

    # before a speedup is measured, and where none is twice its ceiling, the draft is probed
    assert probes.propose(state_of(baseline(), space=space, draft_shares=shares)).params == DRAFT
    slow = drafted(0.6, 0.2)
    assert slow.value / 10.0 < 2 * (1 / 0.6)
    assert probes.propose(state_of(baseline(), slow, space=space, draft_shares=shares)).params == big

    state = state_of(baseline(), fast, space=space, draft_shares=shares)
    assert probes.propose(state).params == NGRAM  # the capped draft is passed over
    assert (
        probes.propose(state_of(baseline(), fast, past(NGRAM, 9.0, 0.1), space=space, draft_shares=shares))
        is None
    )
    why = state.beyond_reach(("draft-simple", "self-q2"))
    assert (
        why == "draft self-q2 not probed: it reads 60% of the target's weight bytes a token, so no K "
        "speeds decode past x1.7; draft small K=8 measured x6.0"
    )
    # elsewhere than the start a speedup counts no more (the hardware raises it too); without bytes, no cap
    assert (
        state_of(baseline(), drafted(0.95, 0.03, threads=32), space=space, draft_shares=shares).beyond_reach(
            ("draft-simple", "self-q2")
        )
        is None
    )
    assert probes.propose(state_of(baseline(), fast, space=space)).params == big


def test_a_draft_byte_share_is_read_from_dense_models_only():
    target = {"weights_bytes": 19e9}
    drafts = {
        "small": {"weights_bytes": 0.5e9},
        "moe": {"weights_bytes": 3e9, "expert_count": 64},  # reads its routed experts only
        "unknown": {},
    }
    assert draft_byte_shares(target, drafts) == {"small": 0.5e9 / 19e9}
    assert draft_byte_shares({}, drafts) == {}
    assert byte_ceiling(0.5) == 2.0 and byte_ceiling(1.3) == 1.0  # a draft as large as its target: no gain


def test_best_k_measures_the_leaders_predicted_k_and_not_an_option_that_does_not_pay():
    probe = drafted(0.9, 0.05)
    no_pay = past(NGRAM, 3.0, 0.01)  # drafts little and costs much
    proposal = best_k.propose(state_of(baseline(), probe, no_pay))
    expected = fit([Point(8, probe.acceptance, probe.value / 10.0)]).best_k(range(1, 33))
    assert expected != 8 and proposal.params == {**DRAFT, "draft_max": expected}
    assert proposal.reason.startswith(f"predicted best K={expected} for draft small")
    ranked = best_k.ranked_options(state_of(baseline(), probe, no_pay))
    assert [r[1] for r in ranked] == [("draft-simple", "small"), ("ngram-simple", None)]
    assert ranked[1][0] < 1.0  # the n-gram type is predicted slower than the target alone: no K for it
    slow = drafted(0.2, 0.5)
    assert best_k.propose(state_of(baseline(), slow, no_pay)) is None


TWIN_SPACE = {**SPACE, "draft": ["Choices", {"values": ["small", "twin"]}]}
TWIN = {**DRAFT, "draft": "twin"}


def test_best_k_reads_a_lookups_counts_as_few_drafting_steps_not_a_dear_token():
    a, c, share, steps = 0.85, 0.11, 0.1, 400  # a match on one decode step in ten, cheap verified tokens
    rate = 10.0 * speedup(a, c, 8, share=share)
    counted = past(NGRAM, rate, measured_acceptance(a, 8), drafted=round(share * 8 * steps), steps=steps)
    proposal = best_k.propose(state_of(baseline(), counted))
    best = max(range(1, 33), key=lambda k: speedup(a, c, k, share=share))
    assert best > 8 and proposal.params == {**NGRAM, "draft_max": best}
    assert "drafting on 10% of steps" in proposal.reason
    blind = best_k.propose(state_of(baseline(), past(NGRAM, rate, measured_acceptance(a, 8))))
    assert blind.params["draft_max"] < 8  # without its counts the same trial reads as every step drafting 8


# -- stacks ------------------------------------------------------------------------------------------

SUITES = {"code": 10.0, "prose": 10.0}


def test_stacks_put_a_lookup_that_paid_on_some_suite_on_the_best_draft():
    base = past(BASE, 10.0, role="baseline", suites=SUITES)
    draft = past({**DRAFT, "lookup": "none"}, 20.0, 0.7, suites={"code": 20.0, "prose": 20.0})
    lookup = past(NGRAM, 12.0, 0.4, suites={"code": 15.0, "prose": 9.0})
    proposal = stacks.propose(state_of(base, draft, lookup, space=STACK_SPACE))
    assert proposal.stage == "stacks"
    assert proposal.params == {**DRAFT, "lookup": "ngram-simple", "lookup_max": 8}  # its K alone, stacked
    assert "faster on code" in proposal.reason
    stacked = past(proposal.params, 25.0, 0.8)
    longer = stacks.propose(state_of(base, draft, lookup, stacked, space=STACK_SPACE))
    assert longer.params["lookup_max"] == 16 and longer.reason.startswith("lookup length 16")  # doubled


def test_no_stack_where_the_lookup_paid_on_no_suite_or_the_draft_does_not_pay():
    base = past(BASE, 10.0, role="baseline", suites=SUITES)
    draft = past({**DRAFT, "lookup": "none"}, 20.0, 0.7, suites={"code": 20.0, "prose": 20.0})
    chat = past(NGRAM, 10.0, 0.1, suites={"code": 10.2, "prose": 9.8})
    assert stacks.propose(state_of(base, draft, chat, space=STACK_SPACE)) is None
    slow_draft = past({**DRAFT, "lookup": "none"}, 9.0, 0.2, suites={"code": 9.0, "prose": 9.0})
    paying = past(NGRAM, 12.0, 0.4, suites={"code": 15.0, "prose": 9.0})
    assert stacks.propose(state_of(base, slow_draft, paying, space=STACK_SPACE)) is None
    assert stacks.pays_on(state_of(base, space=STACK_SPACE), paying) == ["code"]


# -- hardware and serving ----------------------------------------------------------------------------


def test_hardware_probes_the_policies_then_walks_threads_on_the_best():
    draft = past(DRAFT, 20.0, 0.7)
    first = hardware.propose(state_of(baseline(), draft))
    assert first.params == {**DRAFT, "numa": "interleave"} and first.reason.startswith(
        "NUMA interleave at 16 threads with"
    )
    interleaved = past({**DRAFT, "numa": "interleave"}, 22.0, 0.7)
    walk = hardware.propose(state_of(baseline(), draft, interleaved))
    assert walk.params == {**DRAFT, "numa": "interleave", "threads": 8}
    assert walk.reason.startswith("threads 8: the ladder (16, 8) with NUMA interleave")


def test_the_hardware_walks_with_the_fitted_best_k_where_one_reading_outran_it_within_the_noise():
    probe = drafted(0.9, 0.05)
    pick = fit([Point(8, probe.acceptance, probe.value / 10.0)]).best_k(range(1, 33))
    at_pick = drafted(0.9, 0.05, pick)

    def walked_k(high_reading: float) -> int:
        lucky = past({**DRAFT, "draft_max": 32}, high_reading, drafted(0.9, 0.05, 32).acceptance)
        return hardware.propose(state_of(baseline(), probe, at_pick, lucky)).params["draft_max"]

    # K=32 read 4% above the model's pick, which the fit through all three ranks first: within the noise of two
    # launches (``SearchState.close``: 7%)
    assert walked_k(at_pick.value * 1.04) == pick
    assert walked_k(at_pick.value * 1.12) == 32  # far above it: the reading stands


def test_hardware_tries_the_prior_pair_first_and_trusts_its_policy_when_it_leads():
    prior = {
        "hardware": {"numa": "interleave", "threads": 24},
        "study": "old",
        "trial": 7,
        "tokens_per_second": 30.0,
        "same_target": False,
    }
    draft = past(DRAFT, 20.0, 0.7)
    first = hardware.propose(state_of(baseline(), draft, prior=prior))
    assert (
        first.params == {**DRAFT, "numa": "interleave", "threads": 24} and "best on this host" in first.reason
    )
    pair = past({**DRAFT, "numa": "interleave", "threads": 24}, 25.0, 0.7)
    after = hardware.propose(state_of(baseline(), draft, pair, prior=prior))
    assert after.params["numa"] == "interleave" and after.params["threads"] == 16  # no NUMA none probe


# A 96-core, 4-node host as it presents threads: every integer from 1 to 96.
WIDE_SPACE = {
    **SPACE,
    "numa": ["Choices", {"values": ["none", "interleave", "bind"]}],
    "numa_node": ["Choices", {"values": [0, 1, 2, 3]}],
    "threads": ["IntRange", {"low": 1, "high": 96, "step": 1, "log": False}],
}
WIDE_DRAFT = {**DRAFT, "threads": 96}


def peaked(t: int) -> float:
    """Decode over threads: bandwidth saturates, then contention from 60 (a 96-core EPYC's shape)."""
    return (1 - math.exp(-min(t, 60) / 14)) * (1 - 0.35 * max(0, t - 60) / 96)


def flat(t: int) -> float:
    """Saturated early and level up to all cores."""
    return 1 - math.exp(-t / 10)


def replay_hardware(curve, saturation=None, node_curve=None, policy=None) -> list[PastTrial]:
    """The hardware stage run to its end on a noiseless host: each proposal measured by ``curve`` (bind: on one
    node, ``node_curve``), times the policy's factor."""
    factor = policy or {"none": 0.8, "interleave": 1.0, "bind": 0.6}
    trials = [
        past({**BASE, "threads": 96}, 10.0, role="baseline"),
        past(WIDE_DRAFT, 20.0 * factor["none"] * curve(96), 0.7),
    ]
    for _ in range(40):
        proposal = hardware.propose(state_of(*trials, space=WIDE_SPACE, saturation=saturation))
        if proposal is None:
            break
        p = proposal.params
        shape = (node_curve or curve) if p["numa"] == "bind" else curve
        trials.append(past(p, 20.0 * factor[p["numa"]] * shape(p["threads"]), 0.7))
    return trials[2:]


def test_the_copy_probes_rung_is_measured_on_a_policy_still_to_probe():
    """The rung that says where the policies are compared (the probe's point or all cores) is measured on the
    first policy other than the baseline's, at both, so that policy is probed by it: none at 32 is never asked."""
    trials = replay_hardware(peaked, saturation=32)
    first = [(r.params["numa"], r.params["threads"]) for r in trials[:3]]
    assert first[:2] == [("interleave", 32), ("interleave", 96)] and first[2][0] == "bind", first
    assert ("none", 32) not in {(r.params["numa"], r.params["threads"]) for r in trials}


def test_the_thread_ladder_is_coarse_and_seeded_by_the_bandwidth_probe():
    values = list(range(1, 97))
    assert hardware.thread_ladder(values, 96) == [96, 72, 48, 24]
    assert hardware.thread_ladder(values, 96, saturation=32) == [96, 32, 72, 48, 24]
    assert hardware.thread_ladder(values, 96, saturation=70) == [96, 70, 48, 24]  # 72 is within a step of 70
    assert hardware.thread_ladder(values, 24) == [24, 18, 12, 6] and hardware.thread_step(96) == 6
    assert hardware.thread_ladder([1, 2], 2) == [2, 1] and hardware.thread_step(2) == 1


def test_the_bracket_halves_the_wider_gap_beside_the_best_until_a_step():
    points = {24: 0.80, 48: 0.90, 72: 0.97, 96: 0.90}  # the best, 72, clearly above 48 and 96
    assert hardware.bracket(points, 1, 96, 6) == [60.0, 84.0]
    assert hardware.bracket({**points, 60: 1.0, 54: 0.96, 66: 0.96}, 1, 96, 6) == []  # gaps of 6: done
    tied = {24: 0.80, 48: 0.96, 72: 0.97, 96: 0.90}  # 48 within the noise of 72: level between
    # past 72 only: not below 48, where fewer threads may tie (the race's resource rule decides ties)
    assert hardware.bracket(tied, 1, 96, 6) == [84.0]
    level = {24: 0.90, 48: 0.99, 72: 1.0, 96: 0.995}  # a flat stretch from 48: nothing to halve
    assert hardware.bracket(level, 1, 96, 6) == []
    near = {24: 0.80, 48: 0.97, 72: 1.0, 96: 0.97}  # 3% below, within LEVEL
    assert hardware.best_count(near) == 72 and hardware.bracket(near, 1, 96, 6) == []


def test_on_a_1_to_96_host_the_walk_finds_the_top_and_never_steps_by_one():
    trials = replay_hardware(peaked, saturation=48)
    on = [r.params["threads"] for r in trials if r.params["numa"] == "interleave"]
    assert len(set(on)) == len(on) and min(abs(a - b) for a in on for b in on if a != b) >= 6
    best = max(trials, key=lambda r: r.value)
    assert best.params["numa"] == "interleave" and best.value >= 0.97 * 20.0 * max(map(peaked, range(1, 97)))
    assert len(trials) <= 14  # three policies, the ladder, a few brackets


def test_flat_near_all_cores_spends_at_most_three_thread_trials_beyond_the_ladder():
    trials = replay_hardware(flat)
    ladder = set(hardware.thread_ladder(list(range(1, 97)), 96))
    beyond = [r for r in trials if r.params["numa"] == "interleave" and r.params["threads"] not in ladder]
    assert len(beyond) <= 3, [r.params["threads"] for r in beyond]


def test_a_ladder_rung_that_reads_high_on_a_flat_curve_is_not_bracketed_on_both_sides():
    """The best of a ladder is the highest of several noisy readings: 48 reading 3% high puts 72, level with it,
    2% below (one tie) and 32 6% below; the walk halves the gap to 32 only."""
    trials = replay_hardware(lambda t: flat(t) * (1.03 if t == 48 else 1.0), saturation=32)
    ladder = set(hardware.thread_ladder(list(range(1, 97)), 96, saturation=32))
    beyond = [
        r.params["threads"]
        for r in trials
        if r.params["numa"] == "interleave" and r.params["threads"] not in ladder
    ]
    assert beyond == [40], beyond


def test_the_walk_sees_every_thread_count_where_prompt_threads_follow_threads():
    """Where the space tunes prompt threads apart (``threads_batch``), each rung's prompt threads follow its
    threads: the walk compares the rungs, not only the trial whose prompt threads match the incumbent's. On a
    16-core host it once saw 12 alone and halved to 6, below the 8 it had measured clearly lower."""
    space = {
        "spec_type": ["Choices", {"values": ["none", "ngram-simple"]}],
        "draft_max": ["IntRange", {"low": 2, "high": 16, "step": 1, "log": False}],
        "temperature": ["Choices", {"values": [0.0]}],
        "numa": ["Choices", {"values": ["none"]}],
        "threads": ["IntRange", {"low": 1, "high": 16, "step": 1, "log": False}],
        "threads_batch": ["IntRange", {"low": 1, "high": 16, "step": 1, "log": False}],
    }
    base = {"spec_type": "none", "temperature": 0.0, "numa": "none"}
    ngram = {**base, "spec_type": "ngram-simple", "draft_max": 4}
    trials = [past({**base, "threads": 16, "threads_batch": 16}, 897.0, role="baseline")] + [
        past({**ngram, "threads": t, "threads_batch": t}, rate, 0.6)
        for t, rate in ((16, 1297.0), (12, 1324.0), (8, 995.0), (4, 541.0))
    ]
    proposal = hardware.propose(state_of(*trials, space=space, saturation=12))
    assert proposal is not None and proposal.params["threads"] == 10, proposal  # between 8 and the best, 12
    assert proposal.params["threads_batch"] == 10  # prompt threads follow


def test_bind_is_walked_within_one_nodes_cores():
    def node(t: int) -> float:  # one node's 24 cores: saturates near 12, oversubscribed above 24
        return (1 - math.exp(-min(t, 24) / 4)) * (1 - 0.5 * max(0, t - 24) / 24)

    trials = replay_hardware(peaked, 48, node, {"none": 0.8, "interleave": 1.0, "bind": 1.3})  # bind wins
    bound = [r.params for r in trials if r.params["numa"] == "bind"]
    assert {p["numa_node"] for p in bound} == {0, 1, 2, 3}  # the other nodes tried once bind led
    assert max(p["threads"] for p in bound) <= 24 and bound[0]["threads"] == 12  # the probe's point, per node


SERVING_SPACE = {**SPACE, "parallel": ["Choices", {"values": [1, 2, 4, 8, 16]}]}


def test_serving_tries_the_slots_at_the_objectives_level_first_then_walks():
    base = baseline(parallel=1)
    draft = past({**DRAFT, "parallel": 1}, 20.0, 0.7)
    first = serving.propose(state_of(base, draft, space=SERVING_SPACE, users=8))
    assert first.params["parallel"] == 8 and first.reason.startswith("8 slots for 8 users")
    at8 = past({**DRAFT, "parallel": 8}, 60.0, 0.7)
    walk = serving.propose(state_of(base, draft, at8, space=SERVING_SPACE, users=8))
    assert walk.params["parallel"] == 4  # the neighbours of the best (8): 4, then 16
    at4, at16 = past({**DRAFT, "parallel": 4}, 40.0, 0.7), past({**DRAFT, "parallel": 16}, 55.0, 0.7)
    assert serving.propose(state_of(base, draft, at8, at4, at16, space=SERVING_SPACE, users=8)) is None


# -- experts and temperature -------------------------------------------------------------------------

MOE_SPACE = {**SPACE, "experts": ["IntRange", {"low": 1, "high": 8, "step": 1, "log": False}]}


def test_experts_bisect_down_to_the_quality_floor_and_ask_if_speculation_still_pays():
    base = baseline(experts=8)
    draft = past({**DRAFT, "experts": 8}, 20.0, 0.7)
    first = experts.propose(state_of(base, draft, space=MOE_SPACE))
    assert first.params["experts"] == 4 and "feasible down to 8" in first.reason
    below = past({**DRAFT, "experts": 4}, 30.0, 0.7, feasible=False)
    second = experts.propose(state_of(base, draft, below, space=MOE_SPACE))
    assert second.params["experts"] == 6 and "not at 4" in second.reason
    at_floor = [past({**DRAFT, "experts": e}, 20.0 + e, 0.7, feasible=e > 6) for e in (6, 7)]
    last = experts.propose(state_of(base, draft, below, *at_floor, space=MOE_SPACE))
    assert last.params == {**BASE, "experts": 7} and "does speculation still pay" in last.reason  # 6 < 7


def test_temperature_walks_to_the_neighbours_until_quality_falls():
    draft = past(DRAFT, 20.0, 0.7)
    first = temperature.propose(state_of(baseline(), draft))
    assert first.params == {**DRAFT, "temperature": 0.5} and first.stage == "speculation"
    too_hot = past({**DRAFT, "temperature": 0.5}, 25.0, 0.7, feasible=False)
    assert temperature.propose(state_of(baseline(), draft, too_hot)) is None  # and 1.0 is hotter still


def test_temperature_walks_past_a_step_that_read_within_the_noise_of_the_best():
    """The incumbent is the highest of many single readings: a step that read just below it may be the better one,
    so the walk goes one past it; a step that lost beyond the noise stops the walk there."""
    best = past(DRAFT, 20.0, 0.7)
    level = past({**DRAFT, "temperature": 0.5}, 19.5, 0.7)
    proposal = temperature.propose(state_of(baseline(), best, level))
    assert proposal.params == {**DRAFT, "temperature": 1.0}
    assert proposal.reason.startswith(
        "temperature 1.0 past 0.5, which read within the noise of the best (0.0)"
    )
    lost = past({**DRAFT, "temperature": 0.5}, 17.0, 0.7)
    assert temperature.propose(state_of(baseline(), best, lost)) is None
    elsewhere = past({**DRAFT, "temperature": 0.3}, 19.8, 0.7)  # an earlier study's space had 0.3
    assert temperature.propose(state_of(baseline(), best, level, elsewhere)).params == proposal.params


def test_temperature_predicts_the_best_k_where_acceptance_moved():
    probe = drafted(0.8, 0.05)
    warm = past({**DRAFT, "temperature": 0.5}, probe.value * 1.2, measured_acceptance(0.9, 8))
    hot = past({**DRAFT, "temperature": 1.0}, 1.0, 0.1, feasible=False)
    proposal = temperature.propose(state_of(baseline(), probe, warm, hot))
    assert proposal.params["temperature"] == 0.5 and proposal.params["draft_max"] > 8
    assert proposal.reason.startswith(f"predicted best K={proposal.params['draft_max']} at temperature 0.5")


# -- refinement --------------------------------------------------------------------------------------


def test_refinement_checks_threads_then_walks_k_around_the_incumbent():
    space = {**SPACE, "spec_type": ["Choices", {"values": ["none", "draft-simple"]}]}
    probe = drafted(0.8, 0.05)
    first = refinement.propose(state_of(baseline(), probe, space=space))
    assert first.params == {**DRAFT, "threads": 8} and first.stage == "refinement"
    done = [past({**DRAFT, "threads": t}, 1.0, 0.5) for t in (8, 24)]
    line = refinement.propose(state_of(baseline(), probe, *done, space=space))
    assert line.params == {**DRAFT, "draft_max": 12} and "line search around the best K=8" in line.reason


def test_refinement_measures_another_option_within_the_noise_at_its_best_k():
    mine = drafted(0.8, 0.05)
    close = past(NGRAM, mine.value * 0.99, mine.acceptance)  # the same curve, a little slower
    proposals = refinement.other_options(state_of(baseline(), mine, close), mine.params)
    assert len(proposals) == 1 and proposals[0][0]["spec_type"] == "ngram-simple"
    assert "predicted best K=" in proposals[0][2] and proposals[0][2].endswith("predicted within 7%")


def test_refinement_measures_an_option_within_the_launch_noise_not_only_within_3_percent():
    """Two options compared at the start on one launch each are within the noise up to one standard deviation of
    the difference of two launches: at the prior launch spread (5%, before three baseline measures) an option
    predicted 5% slower is measured at the final configuration; on a host whose baseline re-measures spread 1%,
    the floor of 3% leaves it out."""
    mine = drafted(0.8, 0.05)
    twin = past(TWIN, mine.value * 0.95, mine.acceptance)
    state = state_of(baseline(), mine, twin, space=TWIN_SPACE)
    assert state.close == pytest.approx(math.sqrt(2) * 0.05)
    proposals = refinement.other_options(state, mine.params)
    assert [p[0]["draft"] for p in proposals] == ["twin"] and proposals[0][2].endswith("within 7%")
    quiet = [past(BASE, value, role="sentinel") for value in (10.1, 9.9)]
    state = state_of(baseline(), *quiet, mine, twin, space=TWIN_SPACE)
    assert state.close == 0.03 and refinement.other_options(state, mine.params) == []


def test_from_the_baseline_alone_only_the_walks_on_the_target_itself_propose():
    """Before any speculative trial, the stages that walk on speculation have nothing to walk on; hardware and
    refinement walk on the best so far, the target alone."""
    state = state_of(baseline())
    for stage in (best_k, stacks, serving, experts, temperature):
        assert stage.propose(state) is None, stage.__name__
    assert hardware.propose(state).params == {**BASE, "numa": "interleave"}
    assert refinement.propose(state).params == {**BASE, "threads": 8}


# -- prompt threads ----------------------------------------------------------------------------------

BATCH_SPACE = {**WIDE_SPACE, "threads_batch": ["IntRange", {"low": 1, "high": 96, "step": 1, "log": False}]}


def test_prompt_threads_follow_threads_and_are_compared_at_every_core():
    base = past({**BASE, "threads": 96, "threads_batch": 96}, 10.0, role="baseline")
    tuned = past({**WIDE_DRAFT, "numa": "interleave", "threads": 48, "threads_batch": 48}, 30.0, 0.7)
    state = state_of(base, tuned, space=BATCH_SPACE)
    assert (
        state.complete({**WIDE_DRAFT, "threads": 36})["threads_batch"] == 36
    )  # a plan leaves them to follow
    first = prompt_threads.propose(state)
    assert first.params == {**tuned.params, "threads_batch": 96} and first.reason.startswith(
        "prompt threads 96"
    )
    at96 = past(first.params, 29.5, 0.7)
    assert prompt_threads.propose(state_of(base, tuned, at96, space=BATCH_SPACE)) is None  # both measured
    assert prompt_threads.propose(state_of(base, tuned)) is None  # not searched: nothing to propose
    walk = hardware.propose(state_of(base, at96, space=BATCH_SPACE))
    assert (
        walk is None
        or "threads_batch" not in walk.params
        or walk.params["threads_batch"] == walk.params["threads"]
    )


def test_ties_widen_to_the_noise_the_baselines_re_measures_show_and_hardware_trials_run_whole():
    from tuner.search.pruning import may_prune, should_prune

    quiet = [
        past({**BASE, "threads": 96}, v, role="baseline" if i == 0 else "sentinel")
        for i, v in enumerate((10.0, 10.03, 9.97))
    ]
    noisy = [
        past({**BASE, "threads": 96}, v, role="baseline" if i == 0 else "sentinel")
        for i, v in enumerate((10.0, 11.2, 9.0, 10.6))
    ]
    assert state_of(*quiet, space=WIDE_SPACE).tie == 0.02  # at least evidence.THREAD_TIE
    assert state_of(*noisy, space=WIDE_SPACE).tie == 0.10  # a 16-core host's re-measures spread 7%: the cap
    assert state_of(quiet[0], space=WIDE_SPACE).tie == 0.02  # fewer than three: the floor
    # from the first trial on, its passes' disagreement: a standard error of 2.5% within each launch
    disagreeing = [replace(t, within_error=0.025) for t in quiet]
    assert state_of(*disagreeing, space=WIDE_SPACE).tie == pytest.approx(2 * math.sqrt(2) * 0.025)
    assert state_of(disagreeing[0], space=WIDE_SPACE).tie == pytest.approx(2 * math.sqrt(2) * 0.025)
    # a thread walk compares its trials within the tie: a trial stopped on one noisy pass would leave a partial rate
    assert may_prune("search") and not may_prune("search", "hardware")
    assert "never pruned" in should_prune([], [], "search", 10, "hardware").reason


def test_a_trials_error_within_its_launch_is_its_passes_cv_over_the_root_of_their_count():
    from tuner.search.history import within_error
    from tuner.storage.records import Spread, TrialRecord

    record = TrialRecord(
        number=1, state="COMPLETE", role="search", config=None, spread=Spread(4, 0.06, False)
    )
    assert within_error(record) == pytest.approx(0.03)
    assert within_error(replace(record, spread=Spread(1, None, None))) is None  # one pass: unknown, not quiet


# -- the target's quantization -----------------------------------------------------------------

QUANT_SPACE = {**SPACE, "target_quant": ["Choices", {"values": ["source", "Q8_0", "Q4_0", "Q2_K"]}]}
SOURCE = {"target_quant": "source"}


def test_the_variants_are_walked_in_order_with_the_sources_best_speculation():
    history = [baseline(**SOURCE), drafted(0.8, 0.05, target_quant="source")]
    proposal = target_quant.propose(state_of(*history, space=QUANT_SPACE))
    assert proposal.params == {**DRAFT, "target_quant": "Q8_0"} and "Q8_0" in proposal.reason
    # a variant over the KLD ceiling (infeasible whatever speculates on it) is not walked again
    history += [
        drafted(0.7, 0.05, base=14.0, target_quant="Q8_0"),
        past({**DRAFT, "target_quant": "Q4_0"}, 30.0, 0.5, feasible=False),
    ]
    proposal = target_quant.propose(state_of(*history, space=QUANT_SPACE))
    assert proposal.params == {**DRAFT, "target_quant": "Q2_K"}
    history.append(past({**DRAFT, "target_quant": "Q2_K"}, 40.0, 0.3, feasible=False))
    # Q8_0 leads: the target alone on it (its own rate: K's baseline), then K walked again there
    proposal = target_quant.propose(state_of(*history, space=QUANT_SPACE))
    assert proposal.params == {**BASE, "target_quant": "Q8_0"} and "alone" in proposal.reason
    history.append(past({**BASE, "target_quant": "Q8_0"}, 14.0))
    proposal = target_quant.propose(state_of(*history, space=QUANT_SPACE))
    assert proposal.params["target_quant"] == "Q8_0" and proposal.params["draft_max"] != 8
    assert proposal.params["spec_type"] == "draft-simple" and "K=" in proposal.reason


def test_no_variant_stage_without_variants_and_plans_carry_the_variant():
    assert target_quant.propose(state_of(baseline(), drafted(0.8, 0.05))) is None
    # every plan carries the configuration's variant, as it carries threads: the hardware walk stays on it
    state = state_of(baseline(**SOURCE), space=QUANT_SPACE)
    assert state.params_for(("draft-simple", "small"), 8, *state.start())["target_quant"] == "source"


def test_refinement_keeps_a_drafts_predicted_k_where_its_pick_was_never_measured():
    """The measured best K stands in for the model's pick only where the pick was measured and lost (or for a lookup,
    whose missed keys the model does not know): a draft whose K measured beyond its probe read low has a refit pick
    not measured yet, and the K that read best so far is the one the refit moved away from."""
    mine = drafted(0.8, 0.05)
    probe = past(TWIN, mine.value * 0.97, mine.acceptance)
    longer = past({**TWIN, "draft_max": 16}, 10 * speedup(0.7, 0.05, 16), measured_acceptance(0.7, 16))
    state = state_of(baseline(), mine, probe, longer, space=TWIN_SPACE)
    pick = state.fit_option(("draft-simple", "twin"), 0.0, None).best_k(state.k_values)
    assert pick not in (8, 16)
    proposals = refinement.other_options(state, mine.params)
    assert [(p[0]["draft"], p[0]["draft_max"]) for p in proposals] == [("twin", pick)]
    assert f"predicted best K={pick}" in proposals[0][2]


FINE_SPACE = {**SPACE, "threads": ["IntRange", {"low": 1, "high": 32, "step": 1, "log": False}]}


def test_the_tail_measures_the_incumbents_neighbours_temperature_then_k_then_numa_then_threads():
    trials = [baseline(threads=32), drafted(0.9, 0.05, threads=16), drafted(0.9, 0.05, threads=32, base=9.0)]
    state = state_of(*trials, space=FINE_SPACE)
    first = tail.propose(state)
    assert first is not None and first.stage == "tail" and first.params["temperature"] == 0.5
    hot = past({**DRAFT, "threads": 16, "temperature": 0.5}, 20.0, feasible=False)  # below the quality floor
    cold_k = [past({**DRAFT, "threads": 16, "draft_max": k}, 5.0) for k in (7, 9)]
    proposal = tail.propose(state_of(*trials, hot, *cold_k, space=FINE_SPACE))
    assert proposal is not None and proposal.params == {**DRAFT, "threads": 16, "numa": "interleave"}
    other_policy = past(proposal.params, 15.0)
    proposal = tail.propose(state_of(*trials, hot, *cold_k, other_policy, space=FINE_SPACE))
    assert proposal is not None and proposal.params["threads"] == 8  # none measured below: halfway to 1
    low = past({**DRAFT, "threads": 8}, 12.0)
    proposal = tail.propose(state_of(*trials, hot, *cold_k, other_policy, low, space=FINE_SPACE))
    assert proposal is not None and proposal.params["threads"] == 12 and "halfway to 8" in proposal.reason


def test_the_tail_does_not_walk_a_temperature_again_that_lost_clearly_at_another_k():
    """A new incumbent that differs in K only: the temperature that lost clearly to its own at the old K is not
    stepped to again; one that lost within the noise is."""
    at8, at9 = past(DRAFT, 20.0, 0.7), past({**DRAFT, "draft_max": 9}, 21.0, 0.7)
    lost = past({**DRAFT, "temperature": 0.5}, 15.0, 0.7)
    steps = tail.temperature_steps(state_of(baseline(), at8, at9, lost, space=FINE_SPACE), at9.params)
    assert steps == []
    close = past({**DRAFT, "temperature": 0.5}, 19.8, 0.7)
    [(step, _, reason)] = tail.temperature_steps(
        state_of(baseline(), at8, at9, close, space=FINE_SPACE), at9.params
    )
    assert step == {**at9.params, "temperature": 0.5} and "next to the best's 0.0" in reason


def test_the_tail_leaves_narrow_thread_gaps_and_ends_when_every_neighbour_is_measured():
    incumbent = {**DRAFT, "threads": 16}
    measured = [
        baseline(threads=16),
        past(incumbent, 20.0),
        *(past({**incumbent, "threads": t}, 17.0) for t in (14, 18)),  # gaps of 2: level within the noise
        *(past({**incumbent, "draft_max": k}, 17.0) for k in (7, 9)),
        past({**incumbent, "temperature": 0.5}, 17.0),
        past({**incumbent, "numa": "interleave"}, 17.0),
    ]
    assert tail.thread_halves(state_of(*measured, space=FINE_SPACE), incumbent) == []
    assert tail.propose(state_of(*measured, space=FINE_SPACE)) is None  # the fallback proposes


def test_a_temperature_that_lost_with_the_option_elsewhere_is_not_walked_again():
    """Temperature moves acceptance, which threads and K barely change: a step that lost to the incumbent's own
    temperature at other threads is not walked again from the new incumbent; one that won there is."""
    at16 = past(DRAFT, 20.0, 0.7)
    new = past({**DRAFT, "threads": 24}, 21.0, 0.7)
    lost = past({**DRAFT, "temperature": 0.5}, 18.0, 0.7)
    assert temperature.propose(state_of(baseline(), at16, lost, new)) is None
    won = past({**DRAFT, "temperature": 0.5}, 20.5, 0.7)
    proposal = temperature.propose(state_of(baseline(), at16, won, new))
    assert proposal.params == {**DRAFT, "threads": 24, "temperature": 0.5}


def test_refinement_checks_a_thread_count_once_per_option_not_again_for_each_k():
    space = {**SPACE, "spec_type": ["Choices", {"values": ["none", "draft-simple"]}]}
    probe = drafted(0.8, 0.05)
    done = [past({**DRAFT, "threads": t}, 1.0, 0.5) for t in (8, 24)]
    longer = past({**DRAFT, "draft_max": 12}, probe.value * 1.02, 0.5)
    proposal = refinement.propose(state_of(baseline(), probe, *done, longer, space=space))
    assert proposal.params["threads"] == 16 and "line search" in proposal.reason


def test_the_tail_steps_across_bind_at_the_threads_scaled_by_the_nodes():
    """bind runs one node's share of the host: under bind the host-wide policies at its threads times the nodes,
    under a host-wide policy bind at its threads over the nodes, on the node read best under bind."""
    bound = {**WIDE_DRAFT, "numa": "bind", "numa_node": 1, "threads": 6}
    trials = [baseline(threads=96), past(bound, 20.0), past({**bound, "numa_node": 0}, 19.0)]
    state = state_of(*trials, space=WIDE_SPACE)
    steps = [(p["numa"], p["threads"]) for p, _, _ in tail.across_bind(state, bound)]
    assert steps == [("none", 24), ("interleave", 24)]
    wide = {**WIDE_DRAFT, "threads": 40}
    [(step, _, reason)] = tail.across_bind(state, wide)
    assert (step["numa"], step["numa_node"], step["threads"]) == ("bind", 1, 10) and "over 4 nodes" in reason
