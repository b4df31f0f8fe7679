"""Studies on the real pinned llama.cpp and the synthetic family, persisted in SQLite."""

from dataclasses import replace
from pathlib import Path

import optuna
import pytest
import yaml

from tuner.decisions.drift import busy_of
from tuner.measurement.failures import FailureReason, TrialFailure
from tuner.paths import models_dir
from tuner.prepare import prepare
from tuner.progress import Progress
from tuner.run.objective import StudyObjective
from tuner.run.study_loop import run_study
from tuner.run.study_start import open_study
from tuner.storage import store
from tuner.studyfile.spec import load_spec

SYNTH = models_dir() / "synthetic"


def write_study(tmp_path: Path, **fields) -> Path:
    """One thread per server: two spin-wait on each other whenever a busy machine preempts one."""
    study = {
        "name": "t",
        "target": str(SYNTH / "target.gguf"),
        "drafts": [str(SYNTH / "draft-large.gguf"), str(SYNTH / "draft-small.gguf")],
        "search_space": {
            "overrides": {
                "spec_type": ["none", "draft-simple"],
                "draft_max": [2, 4, 8],
                "temperature": 0.0,
                "threads": 1,
            }
        },
        "workload": {"suites": ["code"], "n_predict": 32},
        "measurement": {"warmup": 1, "repetitions": 1, "ctx_size": 512, "trial_timeout_s": 120},
        "quality": {"scorer": "agreement", "floor": 0.99},
        "budget": {"trials": 4},
        "storage": f"sqlite:///{tmp_path / 'studies.db'}",
        "sampler": {
            "name": "tpe",
            "seed": 1,
            "prune": False,
        },  # every trial measured whole (pruning: test_trust)
    }
    study.update(fields)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def test_short_study_persists_objectives_and_evidence(tmp_path, synthetic_models):
    lines: list[str] = []
    spec = load_spec(
        write_study(
            tmp_path, warm_start=[{"spec_type": "draft-simple", "draft": "draft-large", "draft_max": 4}]
        )
    )
    run_study(spec, progress=Progress(lines.append))
    study = optuna.load_study(study_name="t", storage=spec.storage)  # re-read from the SQLite file
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    records = store.read_trials(study)
    sentinels = [r for r in records if r.role == "sentinel"]  # only on a busy host (sentinel.after_busy)
    assert len(study.trials) == len(trials) == len(records) and len(records) - len(sentinels) == 4
    assert len(sentinels) <= 3 and (
        not sentinels or busy_of(records[0])
    )  # the baseline ran beside other work
    record = store.read_study_record(study)
    assert record.fingerprint["llama_commit"] == record.build["commit"]
    assert (
        record.target["architecture"] and record.workload["digest"] and record.measurement["n_predict"] == 32
    )
    baseline, warm = records[0], records[1]
    assert baseline.role == "baseline" and baseline.config.spec_type == "none"
    assert warm.role == "warm_start" and warm.config.draft == "draft-large"
    for t, r in zip(trials, records):
        assert len(t.values) == 3 and t.values[0] > 0
        assert r.complete and r.metrics.tokens_per_second == t.values[0] and r.log_tail
        assert len(r.samples) == len(r.outputs) and r.spread.repetitions == 1 and r.spread.cv is None
        assert "--port" not in r.argv and r.command.binary.endswith("llama-server")  # the pure command
        if r.config.spec_type == "draft-simple":
            assert r.drafted > 0 and 0 < r.metrics.acceptance <= 1
            # greedy speculation is lossless: same tokens as the baseline
            assert r.metrics.quality == pytest.approx(1.0)
    assert baseline.metrics.speedup == pytest.approx(1.0)
    assert any(line.startswith("[4/4]") for line in lines)

    # running it again resumes: the budget counts finished trials, nothing is re-run
    run_study(spec, trials=5, progress=Progress(lines.append))
    again = store.read_trials(optuna.load_study(study_name="t", storage=spec.storage))
    assert len([r for r in again if r.role != "sentinel"]) == 5


def test_expert_reduction_changes_speed_and_quality(tmp_path, synthetic_models):
    path = write_study(
        tmp_path,
        target=str(SYNTH / "moe-target.gguf"),
        drafts=[],
        search_space={"overrides": {"spec_type": "none", "threads": 1, "temperature": 0.0}},
        workload={"suites": ["code"], "n_predict": 48},
    )
    spec = load_spec(path)
    ctx = prepare(spec)
    study = open_study(ctx)
    assert ctx.space.default_experts and ctx.space.default_experts > 1
    objective = StudyObjective(ctx, study, progress=Progress.quiet())
    study.enqueue_trial(
        {"spec_type": "none", "experts": ctx.space.default_experts, "threads": 1},
        user_attrs={store.ROLE: "baseline"},
    )
    study.enqueue_trial({"spec_type": "none", "experts": 1, "threads": 1})
    study.optimize(objective, n_trials=2)
    full, one = store.read_trials(study)
    # each trial's fastest request (a busy machine only slows requests down), with a margin: measured 1.6x to 2.8x
    assert max(s["tokens_per_second"] for s in one.samples) >= 1.2 * max(
        s["tokens_per_second"] for s in full.samples
    )
    assert full.metrics.quality == pytest.approx(1.0)
    assert one.metrics.quality < 1.0


def test_speculation_that_drafts_nothing_fails_with_its_reason(tmp_path, synthetic_models):
    """llama.cpp serves an incompatible draft silently without speculation; we must not."""
    spec = load_spec(write_study(tmp_path))
    ctx = prepare(spec)
    study = open_study(ctx)
    # bypass the validation that refuses this draft, to see what llama.cpp does with it
    ctx.launch.drafts["draft-large"] = (SYNTH / "incompatible-draft.gguf").resolve()
    objective = StudyObjective(ctx, study, progress=Progress.quiet())
    study.enqueue_trial({"spec_type": "draft-simple", "draft": "draft-large", "draft_max": 4, "threads": 1})
    study.optimize(objective, n_trials=1, catch=(TrialFailure,))
    trial = store.read_trial(study.trials[0])
    assert trial.state == "FAIL"
    assert trial.failure.reason == FailureReason.SPECULATION_UNAVAILABLE.value
    assert "drafted nothing" in trial.failure.detail
    assert trial.log_tail and trial.argv  # what was launched, and what it said


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
    stored = store.read_study_record(study)
    store.write_study_record(study, replace(stored, fingerprint=dict(stored.fingerprint, physical_cores=96)))
    with pytest.raises(UserError, match="physical_cores differs"):
        open_study(ctx)
