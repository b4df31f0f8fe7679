"""suggest(): conditional knobs, enqueue round trip, space digest; resolve_space and the target's announced types."""

from pathlib import Path

import optuna
import pytest

from tuner.errors import UserError
from tuner.knobs.config import Choices, FloatRange, IntRange, RawSpace, TrialConfig
from tuner.search.space import (
    ResolvedSpace,
    SpaceHost,
    SpaceTarget,
    baseline_config,
    enqueue_params,
    resolve_space,
    suggest,
)
from tuner.studyfile.validate import Fields


def space(**domains) -> ResolvedSpace:
    base = {
        "spec_type": Choices(("none", "draft-simple", "ngram-simple", "ngram-cache")),
        "draft": Choices(("large", "small")),
        "draft_max": IntRange(1, 16, log=True),
        "draft_min": IntRange(0, 4),
        "temperature": FloatRange(0.0, 1.0, step=0.1),
        "experts": IntRange(1, 4),
        "numa": Choices(("none",)),
        "threads": IntRange(1, 2),
    }
    base.update(domains)
    return ResolvedSpace(base, default_experts=4, physical_cores=2, allow_smt=False)


def test_knobs_are_conditional_on_spec_type():
    s = space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen = {}
    for _ in range(60):
        trial = study.ask()
        config = suggest(trial, s)
        study.tell(trial, 0.0)
        seen.setdefault(config.spec_type, []).append(trial.params)
        if config.spec_type == "draft-simple":
            assert config.draft in ("large", "small") and 1 <= config.draft_max <= 16
            assert config.draft_min <= config.draft_max
        else:
            assert "draft" not in trial.params and config.draft is None
        if config.spec_type in ("none", "ngram-cache"):
            assert "draft_max" not in trial.params  # ngram-cache drafts a fixed 8 in this llama.cpp
        if config.spec_type == "ngram-simple":
            assert "draft_min" not in trial.params
    assert set(seen) == {"none", "draft-simple", "ngram-simple", "ngram-cache"}


def test_baseline_round_trips_through_enqueue():
    s = space()
    base = baseline_config(s)
    assert base == TrialConfig(spec_type="none", temperature=0.0, experts=4, numa="none", threads=2)
    study = optuna.create_study()
    study.enqueue_trial(enqueue_params(base, s))
    trial = study.ask()
    assert suggest(trial, s) == base


def test_digest_changes_with_the_space():
    assert space().digest() == space().digest()
    assert space().digest() != space(draft_max=IntRange(1, 32, log=True)).digest()


def test_lookup_stacks_only_on_a_draft_model_and_sizes_follow_the_type_in_play():
    s = space(
        lookup=Choices(("none", "ngram-simple", "ngram-mod", "ngram-cache")),
        lookup_max=IntRange(2, 16),
        lookup_min=IntRange(1, 4),
        ngram_key=IntRange(2, 8),
        ngram_min_hits=IntRange(1, 3),
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    families = set()
    for _ in range(150):
        trial = study.ask()
        config = suggest(trial, s)
        study.tell(trial, 0.0)
        families.add(config.family)
        p = trial.params
        if config.spec_type != "draft-simple":
            assert "lookup" not in p and not config.stacked
        ngram = config.ngram_type
        assert ("ngram_key" in p) == (ngram in ("ngram-simple", "ngram-mod"))  # ngram-cache has no sizes
        assert ("ngram_min_hits" in p) == (ngram == "ngram-simple")
        assert ("lookup_max" in p) == (config.stacked and ngram != "ngram-cache")
        assert ("lookup_min" in p) == (config.lookup == "ngram-mod")
        if config.lookup_min is not None:
            assert config.lookup_min <= config.lookup_max
    assert families == {"none", "draft", "lookup", "stack"}


def resolve(spec_types: tuple[str, ...], *, from_file: bool, announced: tuple[str, ...]) -> ResolvedSpace:
    """spec_type as a space file (for any model) or a study's overrides (for its target) gives it."""
    raw = RawSpace(
        {"spec_type": Choices(spec_types)}, from_file=frozenset({"spec_type"} if from_file else ())
    )
    return resolve_space(
        raw,
        fields=Fields(Path("study.yaml"), {}),
        target=SpaceTarget(name="target.gguf", drafts=("small",), announced=announced),
        host=SpaceHost(physical_cores=2, logical_cpus=2, numa_policies=("none",), numa_nodes=(0,)),
    )


def test_draft_mtp_is_searched_where_the_target_announces_it():
    asked = resolve(("none", "draft-mtp"), from_file=False, announced=("draft-mtp",))
    assert asked.domains["spec_type"] == Choices(("none", "draft-mtp"))
    assert asked.domains["draft_max"] == Choices((3,))  # K applies to the MTP head
    offered = resolve(("none", "draft-simple"), from_file=True, announced=("draft-mtp",))
    assert offered.domains["spec_type"] == Choices(("none", "draft-simple", "draft-mtp"))
    assert "spec_type: draft-mtp added (target.gguf announces it)" in offered.notes


def test_draft_mtp_is_never_offered_where_the_target_does_not_announce_it():
    for announced in ((), ("draft-dflash",)):  # a sidecar's type is no MTP head
        assert resolve(("none", "draft-simple"), from_file=True, announced=announced).domains[
            "spec_type"
        ] == Choices(("none", "draft-simple"))
    dropped = resolve(("none", "draft-mtp", "ngram-mod"), from_file=True, announced=())
    assert dropped.domains["spec_type"] == Choices(("none", "ngram-mod"))
    assert "spec_type: draft-mtp dropped (target.gguf does not announce it)" in dropped.notes
    kept = resolve(("none", "ngram-mod"), from_file=False, announced=("draft-mtp",))  # the study's own list
    assert kept.domains["spec_type"] == Choices(("none", "ngram-mod"))


def test_asking_for_draft_mtp_on_a_target_without_it_is_one_line():
    with pytest.raises(UserError) as err:
        resolve(("none", "draft-simple", "draft-mtp"), from_file=False, announced=())
    assert str(err.value) == (
        "study.yaml: search_space.spec_type: target.gguf does not announce draft-mtp "
        "(`tuner inspect` lists the types a model announces); remove draft-mtp from spec_type"
    )


def test_the_baseline_serves_with_llama_cpp_defaults_not_a_drawn_kv_cache_type():
    s = space(
        parallel=Choices((2, 4)),
        ubatch=Choices((128, 512)),
        flash_attn=Choices(("off", "auto")),
        cache_type_k=Choices(("q8_0", "f16")),
        cache_type_v=Choices(("q8_0",)),
    )
    base = baseline_config(s)
    assert (base.parallel, base.ubatch, base.flash_attn, base.cache_type_k) == (4, 512, "auto", "f16")
    assert base.cache_type_v == "q8_0"  # f16 is not in its domain: the first choice
    study = optuna.create_study()
    study.enqueue_trial(enqueue_params(base, s))
    assert suggest(study.ask(), s) == base  # the enqueued baseline asks nothing of the sampler


def test_long_prompts_search_prompt_threads_apart_from_the_baseline_default():
    def fitted(long_prompts: str | None, **domains) -> ResolvedSpace:
        return resolve_space(
            RawSpace({"threads": IntRange(1, 16), **domains}),
            fields=Fields(Path("study.yaml"), {}),
            target=SpaceTarget(),
            host=SpaceHost(physical_cores=16, logical_cpus=32, numa_policies=("none",), numa_nodes=(0,)),
            long_prompts=long_prompts,
        )

    chat = fitted("the workload holds conversations")
    assert chat.domains["threads_batch"] == IntRange(1, 16)
    assert any(n.startswith("threads_batch: 1..16, tuned apart") for n in chat.notes)
    assert baseline_config(chat).threads_batch == 16 == baseline_config(chat).threads  # llama.cpp's default
    assert "threads_batch" not in fitted(None).domains and baseline_config(fitted(None)).threads_batch is None
    assert fitted("chat", threads_batch=Choices((8,))).domains["threads_batch"] == Choices((8,))  # as written


def test_a_warm_start_leaves_prompt_threads_to_follow_threads():
    from tuner.search.space import with_followers

    searched = space(threads_batch=IntRange(1, 2))
    assert with_followers({"spec_type": "none", "threads": 2}, searched) == {
        "spec_type": "none",
        "threads": 2,
        "threads_batch": 2,
    }
    assert with_followers({"threads": 2, "threads_batch": 1}, searched)["threads_batch"] == 1  # as written
    assert "threads_batch" not in with_followers({"threads": 2}, space())  # not searched: llama.cpp's default
