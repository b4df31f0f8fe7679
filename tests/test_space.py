"""suggest(): conditional knobs, enqueue round trip, space digest."""

import optuna

from tuner.search.space import Choices, FloatRange, IntRange, ResolvedSpace, TrialConfig, baseline_config, enqueue_params, suggest


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
    s = space(lookup=Choices(("none", "ngram-simple", "ngram-mod", "ngram-cache")), lookup_max=IntRange(2, 16),
              lookup_min=IntRange(1, 4), ngram_key=IntRange(2, 8), ngram_min_hits=IntRange(1, 3))
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
