"""Studies on the real pinned llama.cpp and the synthetic family, persisted in SQLite."""

from pathlib import Path

import optuna
import pytest
import yaml

from tuner.failures import FailureReason, TrialFailure
from tuner.paths import models_dir
from tuner.spec import load_spec
from tuner.study import TrialRunner, open_study, prepare, run_study

pytestmark = pytest.mark.llama
SYNTH = models_dir() / "synthetic"


def write_study(tmp_path: Path, **fields) -> Path:
    study = {
        "name": "t",
        "target": str(SYNTH / "target.gguf"),
        "drafts": [str(SYNTH / "draft-large.gguf"), str(SYNTH / "draft-small.gguf")],
        "search_space": {"overrides": {"spec_type": ["none", "draft-simple"], "draft_max": [2, 4, 8],
                                       "temperature": 0.0, "threads": 2}},
        "workload": {"suites": ["code"], "n_predict": 32},
        "measurement": {"warmup": 1, "repetitions": 1, "ctx_size": 512, "trial_timeout_s": 120},
        "quality": {"scorer": "agreement", "floor": 0.99},
        "budget": {"trials": 4},
        "storage": f"sqlite:///{tmp_path / 'studies.db'}",
        "sampler": {"name": "tpe", "seed": 1},
    }
    study.update(fields)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def test_short_study_persists_objectives_and_evidence(tmp_path, synthetic_models):
    lines: list[str] = []
    spec = load_spec(write_study(tmp_path, warm_start=[{"spec_type": "draft-simple", "draft": "draft-large", "draft_max": 4}]))
    run_study(spec, progress=lines.append)
    study = optuna.load_study(study_name="t", storage=spec.storage)  # re-read from the SQLite file
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(study.trials) == 4 and len(trials) == 4
    assert study.user_attrs["fingerprint"]["llama_commit"] == study.user_attrs["build"]["commit"]
    assert study.user_attrs["target"]["architecture"]
    baseline, warm = study.trials[0], study.trials[1]
    assert baseline.user_attrs["role"] == "baseline" and baseline.params["spec_type"] == "none"
    assert warm.user_attrs["role"] == "warm_start" and warm.params["draft"] == "draft-large"
    for t in trials:
        assert len(t.values) == 3 and t.values[0] > 0
        for key in ("argv", "config", "samples", "cv", "drafted", "accepted", "speedup", "log_tail", "metrics"):
            assert key in t.user_attrs, key
        assert "--port" in t.user_attrs["argv"]
        if t.params["spec_type"] == "draft-simple":
            assert t.user_attrs["drafted"] > 0 and 0 < t.values[1] <= 1
            # greedy speculation is lossless: same tokens as the baseline
            assert t.values[2] == pytest.approx(1.0)
    assert baseline.user_attrs["speedup"] == pytest.approx(1.0)
    assert any(line.startswith("[4/4]") for line in lines)

    # running it again resumes: the budget counts finished trials, nothing is re-run
    run_study(spec, trials=5, progress=lines.append)
    assert len(optuna.load_study(study_name="t", storage=spec.storage).trials) == 5


def test_expert_reduction_changes_speed_and_quality(tmp_path, synthetic_models):
    path = write_study(tmp_path, target=str(SYNTH / "moe-target.gguf"), drafts=[],
                       search_space={"overrides": {"spec_type": "none", "threads": 2, "temperature": 0.0}},
                       workload={"suites": ["code"], "n_predict": 48})
    spec = load_spec(path)
    ctx = prepare(spec)
    study = open_study(ctx)
    assert ctx.space.default_experts and ctx.space.default_experts > 1
    runner = TrialRunner(ctx, study, progress=lambda _: None)
    study.enqueue_trial({"spec_type": "none", "experts": ctx.space.default_experts, "threads": 2},
                        user_attrs={"role": "baseline"})
    study.enqueue_trial({"spec_type": "none", "experts": 1, "threads": 2})
    study.optimize(runner, n_trials=2)
    full, one = study.trials
    assert one.user_attrs["metrics"]["tokens_per_second"] > full.user_attrs["metrics"]["tokens_per_second"]
    assert full.user_attrs["metrics"]["quality"] == pytest.approx(1.0)
    assert one.user_attrs["metrics"]["quality"] < 1.0


def test_speculation_that_drafts_nothing_fails_with_its_reason(tmp_path, synthetic_models):
    """llama.cpp serves an incompatible draft silently without speculation; we must not."""
    spec = load_spec(write_study(tmp_path))
    ctx = prepare(spec)
    study = open_study(ctx)
    # bypass the validation that refuses this draft, to see what llama.cpp does with it
    ctx.launch.drafts["draft-large"] = (SYNTH / "incompatible-draft.gguf").resolve()
    runner = TrialRunner(ctx, study, progress=lambda _: None)
    study.enqueue_trial({"spec_type": "draft-simple", "draft": "draft-large", "draft_max": 4, "threads": 2})
    study.optimize(runner, n_trials=1, catch=(TrialFailure,))
    trial = study.trials[0]
    assert trial.state == optuna.trial.TrialState.FAIL
    assert trial.user_attrs["failure_reason"] == FailureReason.SPECULATION_UNAVAILABLE.value
    assert "drafted nothing" in trial.user_attrs["failure_detail"]
    assert trial.user_attrs["log_tail"]


def test_incompatible_draft_is_refused_before_launch(tmp_path, synthetic_models):
    from tuner.errors import UserError

    spec = load_spec(write_study(tmp_path, drafts=[str(SYNTH / "incompatible-draft.gguf")]))
    with pytest.raises(UserError, match=r"drafts\[0\]: incompatible-draft.gguf cannot draft"):
        prepare(spec)
    assert not (tmp_path / "studies.db").exists()  # nothing written


def test_resume_on_other_hardware_is_refused(tmp_path, synthetic_models):
    from tuner.errors import UserError

    spec = load_spec(write_study(tmp_path))
    ctx = prepare(spec)
    study = open_study(ctx)
    fp = dict(study.user_attrs["fingerprint"], physical_cores=96)
    study.set_user_attr("fingerprint", fp)
    with pytest.raises(UserError, match="physical_cores differs"):
        open_study(ctx)
