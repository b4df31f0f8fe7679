"""The structured search: the analytic model's fit, the pruning rule on crafted samples, the
sampler on a small operator landscape, and the operator replay (seconds per test).

Only relations are checked (finds the optimum within a budget, prunes what is clearly
worse), never the benchmark's targets: those are `make bench`'s.
"""

from __future__ import annotations

import json
from dataclasses import replace

import optuna
import pytest

from benchmarks import operator_replay as op
from benchmarks.landscape_model import Grounding
from benchmarks.landscape_simulation import configurations
from benchmarks.operator_landscapes import CODER_DRAFTS, SERVE, SpaceOptions, landscapes, operator_space
from tuner.knobs.config import TrialConfig
from tuner.search import history
from tuner.search.prior import admitted, find_prior
from tuner.search.pruning import prune_decision, prunes_on, should_prune
from tuner.search.space import baseline_config
from tuner.search.speedup_model import Point, acceptance_probability, fit, measured_acceptance, speedup, walk
from tuner.search.stages import serving as serving_stage
from tuner.search.stages.best_k import LEADER_STEPS
from tuner.storage import store


def small_landscape():
    """dense-code on a smaller space: K 1-16, two temperatures, threads 24-96 (1,372 configurations)."""
    land = landscapes()["dense-code"]
    space = operator_space(
        ("none", "draft-simple"),
        tuple(CODER_DRAFTS),
        SpaceOptions(temperatures=(0.0, 0.5), k_high=16, threads_high=96),
    )
    return replace(land, name="small", space=space)


def small_stack(k_high: int = 16, threads_high: int = 96, temperatures=(0.0,), **changes):
    """dense-stack with one draft, two lookup types alone and stacked, n-gram sizes (72,156 configurations)."""
    space = operator_space(
        ("none", "draft-simple", "ngram-map-k", "ngram-mod"),
        ("qwen2.5-0.5b-instruct-q8_0",),
        SpaceOptions(
            temperatures=temperatures,
            k_high=k_high,
            threads_high=threads_high,
            lookups=("ngram-map-k", "ngram-mod"),
        ),
    )
    return replace(landscapes()["dense-stack"], name="small-stack", space=space, **changes)


# -- the analytic model -----------------------------------------------------------------------


@pytest.mark.parametrize("a,c", [(0.8, 0.05), (0.95, 0.1), (0.6, 0.02)])
def test_fit_recovers_acceptance_and_cost_from_one_trial(a, c):
    k = 8
    f = fit([Point(k, measured_acceptance(a, k), speedup(a, c, k))])
    assert f.a_at(k) == pytest.approx(a, abs=1e-6)
    assert f.c == pytest.approx(c, abs=1e-6)
    ks = range(1, 49)
    assert f.best_k(ks) == max(ks, key=lambda kk: speedup(a, c, kk))  # the best K, predicted before measured


def test_acceptance_inversion_and_limits():
    assert acceptance_probability(measured_acceptance(0.7, 24), 24) == pytest.approx(0.7, abs=1e-6)
    assert speedup(0.0, 0.1, 8) < 1.0  # nothing accepted: speculation only costs
    assert fit([Point(8, 0.0, 0.5)]) is None  # nothing to model


def test_two_points_interpolate_a_decaying_acceptance():
    f = fit([Point(4, measured_acceptance(0.97, 4), 3.8), Point(24, measured_acceptance(0.9, 24), 6.0)])
    assert 0.9 < f.a_at(12) < 0.97


KS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]


def test_a_rounds_fixed_cost_is_fitted_from_two_k_and_the_walk_does_not_spiral_down():
    a, c, o = 0.65, 0.08, 0.5  # a cheap weak draft whose rounds cost half a step besides their tokens

    def curve(k):
        return Point(k, measured_acceptance(a, k), speedup(a, c, k, overhead=o))

    true_best = max(KS, key=lambda k: speedup(a, c, k, overhead=o))
    assert fit([curve(8)]).best_k(KS) < true_best  # one point reads the fixed cost as a dearer token
    two = fit([curve(3), curve(8)])
    assert two.c == pytest.approx(c, abs=1e-6) and two.overhead == pytest.approx(o, abs=1e-6)
    assert walk(curve, KS, probe=8, steps=LEADER_STEPS).best_k(KS) == true_best  # the search's own walk
    close = fit([curve(6), curve(8)])  # K too close to tell the fixed cost from noise: Leviathan's round
    assert close.overhead == 0.0


def test_a_lookup_drafting_on_few_steps_is_not_read_as_a_dear_token():
    a, c, share = 0.8, 0.11, 0.1  # an n-gram lookup: cheap tokens, a match on one step in ten

    def curve(k, known=True):
        return Point(k, measured_acceptance(a, k), speedup(a, c, k, share=share), share if known else None)

    model = fit([curve(8)])
    assert model.c == pytest.approx(c, abs=1e-6) and model.share_at(16) == pytest.approx(share)
    best = max(KS, key=lambda k: speedup(a, c, k, share=share))
    assert model.best_k(KS) == best >= 8
    blind = fit([curve(8, known=False)])  # the same trial without its counts: every step drafting K
    assert blind.c > 2 * c and blind.best_k(KS) < best


def test_draft_counts_are_read_from_the_requests():
    samples = [
        {"predicted_n": 48, "draft_n": 40, "draft_n_accepted": 30},
        {"predicted_n": 48, "draft_n": 8, "draft_n_accepted": 2},
    ]
    assert history.draft_counts(samples) == (48, (47 - 30) + (47 - 2))
    assert history.draft_counts([{"prompt_id": "p", "tokens_per_second": 10.0}]) == (None, None)


# -- the pruning rule -------------------------------------------------------------------------


def test_prunes_a_trial_clearly_below_the_incumbent():
    d = prune_decision([0.55, 0.6, 0.58], unseen=6)
    assert d.prune and d.bound < 1.0 and "optimistic bound" in d.reason


def test_keeps_a_trial_within_the_noise_of_the_incumbent():
    assert not prune_decision([0.97, 1.01, 0.95], unseen=6).prune
    assert not prune_decision([0.96, 0.98, 0.97, 0.95, 0.99, 0.97, 0.96, 0.98, 0.97]).prune


def test_keeps_a_trial_with_too_few_samples_or_a_spread_that_could_hide_a_win():
    assert not prune_decision([0.5, 0.5]).prune  # two samples: too few
    assert not prune_decision(
        [0.5, 0.9, 0.7], unseen=6
    ).prune  # unseen prompts may be as good as the best seen
    assert prune_decision([0.5, 0.9, 0.7, 0.6, 0.55, 0.8, 0.6, 0.7, 0.65], unseen=0).prune


def test_pairs_samples_by_prompt_and_never_prunes_the_baseline_or_a_finalist():
    incumbent = [
        {"prompt_id": p, "tokens_per_second": r} for p, r in (("a", 10.0), ("b", 40.0), ("c", 20.0))
    ] * 2
    slow_prompts = [
        {"prompt_id": "a", "tokens_per_second": 9.8},
        {"prompt_id": "c", "tokens_per_second": 19.5},
        {"prompt_id": "a", "tokens_per_second": 10.1},
    ]
    assert not should_prune(slow_prompts, incumbent).prune  # slow prompts, not a slow configuration
    bad = [{"prompt_id": p, "tokens_per_second": r} for p, r in (("a", 5.0), ("b", 20.0), ("c", 10.0))]
    assert should_prune(bad, incumbent).prune
    assert not should_prune(bad, incumbent, role="baseline").prune
    assert not should_prune(bad, incumbent, role="finalist").prune


def test_no_bound_before_every_suite_was_measured():
    """A configuration slow on code may be the best on prose (a shorter K): the code prompts alone do not prune it."""
    incumbent = [
        {"prompt_id": p, "suite": suite, "tokens_per_second": 20.0}
        for p, suite in (("c1", "code"), ("c2", "code"), ("c3", "code"), ("p1", "prose"), ("p2", "prose"))
    ]
    slow_on_code = [{"prompt_id": p, "suite": "code", "tokens_per_second": 10.0} for p in ("c1", "c2", "c3")]
    decision = should_prune(slow_on_code, incumbent)
    assert not decision.prune and "prose not measured yet" in decision.reason
    assert should_prune(
        slow_on_code + [{"prompt_id": "p1", "suite": "prose", "tokens_per_second": 10.0}], incumbent
    ).prune  # every suite seen: the usual bound
    assert should_prune(slow_on_code, incumbent[:3]).prune  # a code-only workload


# -- the sampler and the replay ---------------------------------------------------------------


def test_replay_asks_integer_ranges_for_k_and_threads_as_a_study_does():
    study, log = op.run_study(small_landscape(), "default", seed=0, budget=6, prune=False)
    trials = study.trials
    assert store.role_of(trials[0]) == "baseline" and log[0].state == "complete"
    spec = next(t for t in trials if "draft_max" in t.distributions)
    assert isinstance(spec.distributions["draft_max"], optuna.distributions.IntDistribution)
    assert isinstance(spec.distributions["threads"], optuna.distributions.IntDistribution)
    assert isinstance(spec.distributions["numa"], optuna.distributions.CategoricalDistribution)
    assert all(store.search_note(t)[0] == "speculation" for t in trials[1:4])  # three drafts probed first
    assert "probe draft" in store.search_note(trials[1])[1]


@pytest.mark.parametrize("seed", [0, 1])
def test_structured_sampler_finds_the_optimum_of_a_small_landscape(seed):
    land = small_landscape()
    study, log = op.run_study(land, "default", seed=seed, budget=15, prune=False)
    scores = op.scores(land, log, 0.03)
    assert scores["trials"] is not None and scores["trials"] <= 15
    reasons = [store.search_note(t)[1] or "" for t in study.trials]
    assert any(r.startswith("predicted best K=") and "acceptance" in r for r in reasons)
    assert {store.search_note(t)[0] for t in study.trials} >= {"speculation", "hardware"}


def test_pruned_trials_are_recorded_with_what_they_measured_and_save_seconds():
    land = small_landscape()
    full = op.scores(land, op.replay(land, "default", 0, 15, prune=False), 0.03)
    study, log = op.run_study(land, "default", 0, 15, prune=True)
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned and all(store.read_trial(t).metrics.tokens_per_second > 0 for t in pruned)
    assert all(store.role_of(t) != "baseline" for t in pruned)
    with_pruning = op.scores(land, log, 0.03)
    assert with_pruning["trials"] is not None
    assert with_pruning["total_seconds"] < full["total_seconds"]


def test_a_replay_reads_a_configuration_alike_whatever_it_measured_before():
    """``operator_replay.Objective.reading_noise``: a configuration's first reading in a replay is the same whether or
    not another configuration was measured first (two rules replayed on one seed are compared on what they chose,
    not on a noise stream one trial apart); its second reading is a new draw, and another seed reads otherwise."""
    land = small_landscape()
    config = baseline_config(land.space)
    other = replace(config, threads=land.space.domains["threads"].low)

    def reading(objective: op.Objective, what) -> float:
        return land.measure(what, objective.reading_noise(what))[1].tokens_per_second

    fresh, after_other = op.Objective(land, 3, False), op.Objective(land, 3, False)
    reading(after_other, other)
    first = reading(fresh, config)
    assert reading(after_other, config) == first
    assert reading(fresh, config) != first
    assert reading(op.Objective(land, 4, False), config) != first


def test_operator_benchmark_prints_a_row_per_strategy():
    result = op.benchmark(
        names=("small",),
        plan=op.ReplayPlan(strategies=("default", "random"), seeds=2, budget=12, baseline_budget=12),
        lands={"small": small_landscape()},
    )
    text = op.markdown(result)
    assert "| default |" in text and "| random |" in text and "with pruning" in text
    row = result["landscapes"]["small"]["strategies"]["default"]
    assert set(row) == {"full", "pruned"} and len(row["full"]["trials_to_target"]) == 2
    worst = row["full"]["worst_trials"]
    assert worst == max(row["full"]["trials_to_target"]) or (
        worst is None and None in row["full"]["trials_to_target"]
    )
    summary = text.splitlines()[2]  # the summary's one row: what wins, the default's median and worst seed
    assert (
        summary.startswith(f"| small | {small_landscape().size:,} | draft | ") and f" | {worst} | " in summary
    )
    assert set(result["targets"]["small"]) == {"median_le_20", "all_by_40", "over_tpe", "tpe_censored", "met"}


def test_fitted_models_list_measured_points_against_the_model():
    from tuner.search.structured_sampler import fitted_models

    study, _ = op.run_study(small_landscape(), "default", seed=0, budget=6, prune=False)
    rows = fitted_models(study)
    assert rows and {r["option"] for r in rows} >= {"draft qwen2.5-0.5b-instruct-q8_0"}
    for r in rows:
        assert r["model_acceptance"] == pytest.approx(
            r["acceptance"], abs=0.02
        )  # the fit passes through its points
        assert 1 <= r["predicted_best_k"] <= 16


def test_the_self_draft_of_the_target_is_not_probed_once_a_small_draft_beats_its_byte_ceiling():
    from tuner.search.structured_sampler import unprobed

    land = small_landscape()
    study, _ = op.run_study(land, "default", seed=0, budget=8, prune=False)
    drafts = [t.params.get("draft") for t in study.trials]
    assert "qwen2.5-coder-32b-q2_k" not in drafts and "qwen2.5-coder-1.5b-q4_k_m" in drafts
    assert store.read_study_record(study).drafts["qwen2.5-coder-32b-q2_k"] == {"weights_bytes": 12e9}
    (why,) = unprobed(study)
    assert why.startswith(
        "draft qwen2.5-coder-32b-q2_k not probed: it reads 63% of the target's weight bytes"
    )
    # without the models' bytes in the record, every draft is probed as before
    bare, _ = op.run_study(replace(land, weights_bytes={}), "default", seed=0, budget=5, prune=False)
    assert "qwen2.5-coder-32b-q2_k" in [t.params.get("draft") for t in bare.trials] and unprobed(bare) == []


# -- warm starts from earlier studies in the same storage --------------------------------------


def test_warm_start_takes_the_hardware_of_the_same_host_and_the_whole_winner_of_the_same_target():
    storage = optuna.storages.InMemoryStorage()
    earlier, _ = op.run_study(small_landscape(), "default", seed=0, budget=12, prune=False, storage=storage)
    winner = store.best_feasible(earlier)
    objectives = small_landscape().objectives

    other_host = replace(small_landscape(), name="other-host", host="Intel Xeon 6980P (SNC3)")
    assert find_prior(storage, other_host.study_record(objectives), other_host.space) is None

    other_model = replace(small_landscape(), name="other-model", target="Qwen3-Coder-30B-A3B-Instruct Q4_K_M")
    prior = find_prior(storage, other_model.study_record(objectives), other_model.space)
    assert prior["study"] == "small" and prior["trial"] == winner.number and not prior["same_target"]
    assert prior["params"] is None  # another model: only the host's knobs carry over
    assert (
        prior["hardware"]["threads"] == winner.config.threads
        and prior["hardware"]["numa"] == winner.config.numa
    )

    prose = replace(small_landscape(), name="prose", prompts=("prose",) * 9)
    prior = find_prior(storage, prose.study_record(objectives), prose.space)
    assert (
        prior["same_target"] and not prior["same_workload"] and prior["params"] is None
    )  # K depends on content

    again = replace(small_landscape(), name="small again")  # the same target and workload: a re-tune
    study, _ = op.run_study(again, "default", seed=0, budget=3, prune=False, storage=storage)
    prior = store.read_prior(study)
    assert prior["same_workload"] and prior["params"] == dict(earlier.trials[winner.number].params)
    assert store.search_note(study.trials[1])[0] == "warm start"  # right after the baseline
    assert study.trials[1].params == prior["params"]


def test_a_prior_keeps_only_the_values_the_new_space_admits():
    space = operator_space(
        ("none", "draft-simple"),
        tuple(CODER_DRAFTS),
        SpaceOptions(temperatures=(0.0,), k_high=8, threads_high=48),
    )
    kept = admitted(
        {
            "spec_type": "draft-simple",
            "draft": "qwen2.5-0.5b-instruct-q8_0",
            "draft_max": 24,
            "numa": "interleave",
            "numa_node": 2,
            "threads": 96,
            "temperature": 0.0,
        },
        space,
    )
    assert kept == {
        "spec_type": "draft-simple",
        "draft": "qwen2.5-0.5b-instruct-q8_0",
        "numa": "interleave",
        "temperature": 0.0,
    }  # K 24 > 8, 96 threads > 48, a node only under bind


def test_the_hardware_stage_tries_the_prior_pair_first_and_skips_policy_probes_when_it_leads():
    storage = optuna.storages.InMemoryStorage()
    op.run_study(small_landscape(), "default", seed=1, budget=14, prune=False, storage=storage)
    other_model = replace(small_landscape(), name="other-model", target="another model")
    study, _ = op.run_study(other_model, "default", seed=1, budget=14, prune=False, storage=storage)
    prior = store.read_prior(study)
    hardware = [t for t in study.trials if store.search_note(t)[0] == "hardware"]
    first = hardware[0].params
    assert {k: first.get(k) for k in prior["hardware"]} == prior["hardware"]
    assert "best on this host in study small" in store.search_note(hardware[0])[1]
    policies = {t.params["numa"] for t in hardware}
    # the interleaved pair beats the baseline's first-touch placement on this landscape: no other policy probed
    assert policies == {prior["hardware"]["numa"]}


# -- prompt lookup and stacks -----------------------------------------------------------------


def _ratio(land, content: str, **knobs) -> float:
    """A configuration's rate on one content type over the target alone at the same hardware."""
    config = TrialConfig(numa="interleave", threads=96, **knobs)
    return (
        land.evaluate(config).rates[content]
        / land.evaluate(
            replace(
                config,
                spec_type="none",
                draft=None,
                draft_max=None,
                lookup=None,
                lookup_max=None,
                ngram_key=None,
                ngram_min_hits=None,
            )
        ).rates[content]
    )


def test_lookup_pays_by_content_and_key_and_a_stack_adds_the_draft_where_lookup_finds_nothing():
    land = landscapes()["dense-stack"]
    lookup = dict(spec_type="ngram-map-k", draft_max=32, ngram_key=3, ngram_min_hits=1)
    by_content = {c: _ratio(land, c, **lookup) for c in ("summarize", "code", "prose")}
    assert (
        by_content["summarize"] > by_content["code"] > by_content["prose"]
    )  # seed 003, Track 8: the task order
    assert (
        _ratio(land, "code", **{**lookup, "ngram_key": None}) < by_content["code"]
    )  # llama.cpp's 12-token key
    draft = dict(spec_type="draft-simple", draft="qwen2.5-0.5b-instruct-q8_0", draft_max=8)
    stack = dict(draft, lookup="ngram-map-k", lookup_max=32, ngram_key=3, ngram_min_hits=1)
    assert _ratio(land, "summarize", **stack) > max(
        _ratio(land, "summarize", **draft), by_content["summarize"]
    )
    assert _ratio(land, "prose", **stack) == pytest.approx(_ratio(land, "prose", **draft), rel=0.03)


def test_the_vectorised_optimum_and_size_match_every_configuration_suggest_can_return():
    land = small_stack(k_high=4, threads_high=48, temperatures=(0.0, 0.7))
    configs = list(configurations(land.space, ()))
    assert land.size == len(configs) == len(set(configs))
    assert any(c.stacked and c.ngram_min_hits for c in configs) and not any(
        c.ngram_key and not c.ngram_type for c in configs
    )
    best = max((land.true_rate(c), c) for c in configs if land.evaluate(c).feasible)
    assert land.optimum[0] == pytest.approx(best[0], rel=1e-9) and land.optimum[1] == best[1]


def test_the_stacked_landscape_is_won_by_a_stack():
    rate, config = landscapes()["dense-stack"].optimum
    assert config.family == "stack" and config.ngram_key is not None
    land = landscapes()["dense-stack"]
    alone = replace(config, lookup=None, lookup_max=None, ngram_key=None, ngram_min_hits=None)
    assert land.true_rate(alone) < 0.9 * rate  # the lookup pays on top of the draft


@pytest.mark.parametrize("seed", [0, 1])
def test_structured_sampler_stacks_lookup_on_the_best_draft_and_plans_every_knob(seed):
    land = small_stack()
    study, log = op.run_study(land, "default", seed=seed, budget=16, prune=False)
    assert op.scores(land, log, 0.03)["trials"] is not None
    stacks = [t for t in study.trials if store.search_note(t)[0] == "stacks"]
    assert stacks and all(
        t.params["lookup"] != "none" and t.params["spec_type"] == "draft-simple" for t in stacks
    )
    assert "faster on" in store.search_note(stacks[0])[1]  # it says on which suites lookup paid alone
    lengths = [t.params["lookup_max"] for t in stacks]
    assert max(lengths) > min(lengths)  # the stacked length is searched, not left at its first value
    for t in study.trials[1:]:  # each planned trial asks exactly what the plan holds: nothing left to chance
        if "search:plan" in t.system_attrs:
            assert json.loads(t.system_attrs["search:plan"]) == t.params
    alone = next(t for t in study.trials if t.params.get("spec_type") == "ngram-map-k")
    assert {"ngram_key", "ngram_min_hits"} <= set(alone.params) and "lookup" not in alone.params
    draft = next(t for t in study.trials if t.params.get("spec_type") == "draft-simple")
    assert draft.params["lookup"] == "none" and "ngram_key" not in draft.params


def test_no_stack_where_lookup_pays_on_no_suite():
    nothing = Grounding(copy=0.0, span=2.0, chance=0.05, repeated=0.0)  # chat that copies nothing
    land = small_stack(prompts=("prose",) * 9, grounding={"prose": nothing})
    study, _ = op.run_study(land, "default", seed=0, budget=14, prune=False)
    assert not any(store.search_note(t)[0] == "stacks" for t in study.trials)
    assert any(t.params.get("spec_type") == "ngram-map-k" for t in study.trials)  # lookup alone was probed


# -- several users at once: the serving landscape and the serving stage --------------------------------------


def _at(land, users: int):
    return replace(land, serving=replace(land.serving, users=users))


def test_aggregate_grows_with_users_until_compute_bound_and_speculation_gains_less():
    land = landscapes()["dense-serve"]
    alone = replace(baseline_config(land.space), numa="interleave", parallel=64)
    drafted = replace(alone, spec_type="draft-simple", draft="qwen2.5-0.5b-instruct-q8_0", draft_max=8)
    rates = {n: _at(land, n).true_rate(alone) for n in (1, 2, 4, 8, 16, 32, 64)}
    assert all(rates[a] < rates[b] for a, b in zip(rates, list(rates)[1:]))  # more users, more tokens in all
    assert rates[2] > 1.8 * rates[1]  # bandwidth-bound: a second user nearly free
    assert rates[64] / rates[32] < 1.3  # compute-bound: saturates
    gains = [_at(land, n).true_rate(drafted) / rates[n] for n in (1, 4, 8, 16)]
    assert gains[0] > 2 and all(a > b for a, b in zip(gains, gains[1:])) and gains[-1] < 1  # stops paying
    queued = _at(land, 8)
    assert queued.true_rate(replace(alone, parallel=2)) < 0.6 * queued.true_rate(replace(alone, parallel=8))
    q4 = land.evaluate(replace(alone, cache_type_k="q4_0"))
    assert (
        not q4.feasible and land.evaluate(replace(alone, cache_type_k="q8_0")).feasible
    )  # the floor knows KV


def test_serving_landscape_optimum_is_the_best_of_every_configuration_at_its_level():
    land = landscapes()["dense-serve"]
    rate, best = land.optimum
    assert land.objectives[0] == "aggregate_tokens_per_second_c8" and best.parallel >= SERVE.users
    assert land.evaluate(best).feasible and rate == pytest.approx(land.true_rate(best))
    assert rate > 1.3 * land.true_rate(baseline_config(land.space))


def long_contexts():
    """Long conversations: every slot's KV cache weighs, so the serving knobs matter (the stage's test)."""
    land = landscapes()["dense-serve"]
    return replace(land, name="serve-long", serving=replace(SERVE, context={"code": 16000, "prose": 16000}))


def test_serving_stage_probes_slots_at_the_level_then_walks_the_knobs(monkeypatch):
    land = long_contexts()
    study, log = op.run_study(land, "default", seed=0, budget=30, prune=True)
    stages = [store.search_note(t) for t in study.trials]
    serving = [t for t, (stage, _) in zip(study.trials, stages) if stage == "serving"]
    assert serving and serving[0].params["parallel"] == SERVE.users  # the level first
    assert "slots for 8 users" in store.search_note(serving[0])[1]
    assert {"ubatch", "flash_attn", "cache_type_k", "cache_type_v"} <= {
        k for t in serving for k, v in t.params.items() if v != study.trials[0].params.get(k)
    }
    assert not any(e.state == "pruned" for e in log)  # aggregate objective: per-request rates never prune
    assert op.scores(land, log, op.TOLERANCE)["trials"] <= 30
    monkeypatch.setattr(serving_stage, "propose", lambda state: None)  # without the stage: missed
    _, without = op.run_study(land, "default", seed=0, budget=30, prune=False)
    assert op.scores(land, without, op.TOLERANCE)["trials"] is None


def test_pruning_judges_only_studies_that_maximise_per_request_rates():
    assert prunes_on(("tokens_per_second", "quality"))
    assert not prunes_on(("aggregate_tokens_per_second_c8", "quality")) and not prunes_on(("p95_ttft_ms_c4",))


def test_the_sampler_maximises_the_first_objective_and_inverts_a_latency():
    land = landscapes()["dense-serve"]
    study, _ = op.run_study(land, "default", seed=1, budget=4, prune=False)
    trials = history.read_history(study)
    assert [r.value for r in trials] == [
        t.values[0] for t in study.trials
    ]  # aggregate at 8 users, not per request
    record = store.read_trial(study.trials[0])
    assert history.objective_value(record, "aggregate_tokens_per_second_c8", True) == pytest.approx(
        1 / trials[0].value
    )
    assert (
        history.objective_value(record, "aggregate_tokens_per_second_c4", False) is None
    )  # a level it did not measure
    assert (
        history.objective_level(["aggregate_tokens_per_second_c8"]) == 8
        and history.objective_level(["tokens_per_second"]) is None
    )


# -- drawn landscapes (benchmarks/landscape_draws) and the default judged on them (benchmarks/held_out) -----


def test_a_seeded_draw_is_the_same_landscape_every_time():
    from benchmarks.landscape_draws import draw, draw_table

    first, again = draw_table(draw(7)), draw_table(draw(7))
    assert first == again and "| thread curve | peak at " in first and "| optimum | " in first
    assert draw(7).description != draw(8).description  # another seed, another host


def test_every_draw_is_within_the_stated_ranges():
    from benchmarks import landscape_draws as ld

    for seed in ld.DEVELOPMENT_SEEDS[:40]:
        land = ld.draw(seed)
        hw = land.hardware
        assert 1 <= len(hw.nodes) <= 4 and hw.cores in ld.CORES and hw.cores // len(hw.nodes) >= ld.NODE_CORES
        assert ld.PEAK_SHARE[0] - 0.05 <= hw.contention_from / hw.cores <= ld.PEAK_SHARE[1] + 0.05
        policy = max((p for p in hw.numa if p != "bind"), key=lambda p: hw.numa[p])
        at = lambda t: land.hardware_factor(TrialConfig(numa=policy, threads=t))  # noqa: E731
        assert ld.FALL[0] - 1e-9 <= 1 - at(hw.cores) / at(hw.contention_from) <= ld.FALL[1] + 1e-9
        assert at(hw.contention_from) >= max(at(t) for t in range(1, hw.logical + 1)) - 1e-12  # the peak
        factors = sorted(hw.numa.values(), reverse=True)
        assert factors[0] == 1.0 and all(
            1 - b / a <= ld.NUMA_STEP[1] + 1e-3 for a, b in zip(factors, factors[1:])
        )
        assert (len(hw.numa) == 1) == (len(hw.nodes) == 1)
        assert 1 <= len(land.drafts) <= 4 and ld.NOISE[0] <= land.cv_launch <= ld.NOISE[1]
        for content in set(land.prompts):  # temperature: one sign per content type, every draft's
            slopes = [d.temp_slope[content] for d in land.drafts.values()]
            assert all(s * slopes[0] >= 0 for s in slopes)
            assert all(ld.TEMP_SLOPE[0] * 1.5 <= s <= ld.TEMP_SLOPE[1] * 1.5 for s in slopes)
        by_size: dict[str, list] = {}
        for name, d in land.drafts.items():
            by_size.setdefault(name.split("-")[1], []).append(d)
        for twins in (v for v in by_size.values() if len(v) == 2):  # a twin pair: within 8% on one type
            gaps = [
                abs(ld.best_k_rate(land, twins[1], c) / ld.best_k_rate(land, twins[0], c) - 1)
                for c in twins[0].accept
            ]
            assert min(gaps) <= ld.TWIN_GAP[1] + 1e-3 and twins[1].cost < twins[0].cost
        if land.lookups:  # lookup pays on some content type
            assert any(g.copy >= ld.GROUNDED["copy"][0] for g in land.grounding.values())


def test_a_draw_prints_as_a_table_and_a_bad_range_is_one_line(capsys):
    from benchmarks.cli import main as bench_main

    assert bench_main(["bench-operator", "--print-draw", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("**draw-3**: ") and "| NUMA policies | " in out and "| configurations | " in out
    assert bench_main(["bench-operator", "--draws", "5-x"]) == 2
    assert "--draws: '5-x' is not held-out, development" in capsys.readouterr().err


def test_a_run_against_an_earlier_one_pairs_each_replay_and_tests_the_split(tmp_path, capsys):
    """``--against``: the same code replays the same draws and seeds bit for bit (every replay the same); a run of
    other draws or seeds is a one-line error naming the file and the fix, as is a file that is not such a run."""
    from benchmarks import held_out
    from benchmarks.cli import main as bench_main

    earlier = tmp_path / "before.json"
    args = ["bench-operator", "--draws", "3-4", "--seeds", "2", "--trials", "8"]
    assert bench_main([*args, "--json", str(earlier)]) == 1  # the bars are not met in 8 trials
    capsys.readouterr()
    bench_main([*args, "--against", str(earlier)])
    out = capsys.readouterr().out
    assert "sooner within the tolerance (or only now) 0, later (or never now) 0, the same 4" in out
    assert "no difference shown at the 5% level" in out
    assert (
        bench_main(
            ["bench-operator", "--draws", "3-4", "--seeds", "1", "--trials", "8", "--against", str(earlier)]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--against {earlier}: it replayed draws 3-4, 2 seeds" in err
    assert "run with the same --draws, --seeds and --trials as it" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"figures": {}}')
    assert bench_main([*args, "--against", str(bad)]) == 2
    assert "no 'replays' list" in capsys.readouterr().err
    # the split: ten replays sooner and none later is 2 / 2^10 by chance; five and five, no difference
    before = json.loads(earlier.read_text())
    after = {**before, "replays": [{**d, "trials": [1, 1]} for d in before["replays"]]}
    faster = held_out.paired(before, after)
    assert (faster["sooner"], faster["later"], faster["replays"]) == (4, 0, 4)
    assert held_out.sign_test(10, 0) == pytest.approx(2 / 2**10)
    assert held_out.sign_test(5, 5) == 1.0 and held_out.sign_test(0, 0) == 1.0
    assert (
        held_out.sign_test(126, 75) < 0.001
    )  # the held-out judgement of the rules not taken (evidence/held-out-draws.md)


def test_a_missed_replay_is_read_for_the_one_knob_group_it_lacks():
    """``held_out.lacks``: the best configuration tried, one knob group at a time set to the optimum's; the group of
    fewest knobs that brings it within the tolerance, or none when two groups are off at once."""
    from benchmarks.held_out import NO_ONE_GROUP, lacks
    from benchmarks.landscape_draws import draw
    from benchmarks.operator_replay import TrialLog

    land = draw(3)
    rate, optimum = land.optimum

    def tried(**off) -> list[TrialLog]:
        config = replace(optimum, **off)
        slower = TrialLog(config.as_dict(), "complete", land.true_rate(config) / 2, 1.0, "probe", "")
        return [slower, TrialLog(config.as_dict(), "complete", land.true_rate(config), 1.0, "probe", "")]

    assert land.true_rate(replace(optimum, threads=1)) < 0.9 * rate
    assert lacks(land, tried(threads=1), 0.03) == "threads"  # not the wider group with the NUMA policy
    assert lacks(land, tried(draft_max=1), 0.03) == "K"
    assert lacks(land, tried(threads=1, draft_max=1), 0.03) == NO_ONE_GROUP


def test_where_the_first_trials_go_is_read_from_the_stages_each_trial_names():
    """``held_out.hardware_span``: trials before the hardware stage first proposes, and its own until it first hands
    over (a later return to it is not counted); ``span_lines`` gives their medians and the share by the median bar."""
    from benchmarks import held_out
    from benchmarks.operator_replay import TrialLog

    def log(*stages: str) -> list[TrialLog]:
        return [TrialLog({}, "complete", 1.0, 1.0, stage, "") for stage in stages]

    walk = log("baseline", "speculation", "speculation", "hardware", "hardware", "speculation", "hardware")
    assert held_out.hardware_span(walk) == [3, 2]
    assert held_out.hardware_span(log("baseline", "speculation")) is None
    result = {
        "tolerance": 0.03,
        "replays": [
            {"spans": [[3, 2], [6, 9], None], "trials": [4, None, 2]},
            {"spans": [[5, 9]], "trials": [20]},
        ],
    }
    line = held_out.span_lines(result, "3%")[0]  # type: ignore[arg-type]
    assert "(3 replays with a hardware stage, medians): 5 before the hardware stage" in line
    assert (
        "9 in it, over by trial 14 (by trial 10 in 33% of the replays); 33% of the replays are within" in line
    )
    assert held_out.span_lines({"replays": [{"trials": [3]}]}, "3%") == []  # type: ignore[arg-type]


def test_held_out_figures_pool_every_seed_and_count_misses_as_infinite():
    from benchmarks import held_out

    def replays(draw: int, trials: list, end: list) -> held_out.DrawReplays:
        return {
            "draw": draw,
            "description": "",
            "optimum": 1.0,
            "best_config": {},
            "trials": trials,
            "regret": {20: end, 40: end},
        }

    plan = held_out.DrawPlan(range(2), seeds=2)
    f = held_out.figures([replays(0, [4, 6], [0.0, 0.01]), replays(1, [None, 30], [0.05, 0.0])], plan)
    assert f["median_trials"] == 18.0 and f["all_seeds_share"] == 0.5 and not f["met"]
    assert f["p90_regret"][40] == pytest.approx(0.05 * 0.7 + 0.01 * 0.3)
    f = held_out.figures([replays(0, [None, None], [0.1, 0.1]), replays(1, [None, 3], [0.1, 0.0])], plan)
    assert f["median_trials"] is None  # more than half missed
    result = held_out.benchmark(held_out.DrawPlan(range(3, 4), seeds=1, budget=6))
    text = held_out.markdown(result)
    assert "| median trials to 3% | " in text and "| 90th percentile of regret at 6 trials | " in text
    replays = result["replays"][0]  # its regret only at checkpoints within the budget: the budget itself
    assert replays["draw"] == 3 and list(replays["regret"]) == [6]
    assert replays["trials"] == [None] and replays["lacks"][0] is not None  # 6 trials miss; what they lack
    assert "What the missed replays lack (1; " in text
    # draw 3 spends 7 trials before the hardware stage (the baseline, its probes, the best K): none in 6
    assert replays["spans"] == [None] and "Where the first trials go" not in text
    assert not result["figures"]["met"]  # no regret at 40 trials: no bar met
    assert result["exact"]["median_trials"] is None  # its one exact replay misses in 6 trials too
    assert "The same draws with exact readings (no launch or request noise" in text


def test_exact_readings_read_alike_whatever_the_seed_where_noisy_ones_differ():
    """``held_out.exact_readings``: with no launch or request noise two seeds measure the same values and so plan the
    same trials (the structured sampler draws nothing at random); with the draw's noise they read differently."""
    from benchmarks import held_out
    from benchmarks.landscape_draws import draw
    from benchmarks.operator_replay import run_study

    def readings(land, seed: int) -> list:
        study, _ = run_study(land, "default", seed, 6, False)
        return [(t.params, t.values) for t in study.trials]

    exact = held_out.exact_readings(draw(3))
    assert readings(exact, 0) == readings(exact, 1)
    assert readings(draw(3), 0) != readings(draw(3), 1)
