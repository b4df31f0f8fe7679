"""The kld scorer: study fields, llama-perplexity's summary lines, and KLD on the synthetic MoE target."""

import inspect
from pathlib import Path

import pytest
import yaml
from gguf_factory import write_gguf

import tuner.measurement.server_process
from tuner.errors import UserError
from tuner.measurement.quality import MEAN_KLD, SAME_TOP, builtin_text, measure_kld, save_kld_base
from tuner.progress import Progress
from tuner.studyfile.spec import load_spec

# The summary as tools/perplexity/perplexity.cpp prints it (kl_divergence()).
SUMMARY = """
====== KL divergence statistics ======
Mean    KLD:   0.002636 ±   0.000410
Maximum KLD:   0.093201
Median  KLD:   0.000512

====== Token probability statistics ======
Mean    Δp: -0.081 ± 0.032 %
Same top p: 95.635 ± 0.912 %
"""


def test_the_summary_lines_are_parsed():
    assert float(MEAN_KLD.search(SUMMARY).group(1)) == pytest.approx(0.002636)
    assert float(SAME_TOP.search(SUMMARY).group(1)) == pytest.approx(95.635)


def write_study(tmp_path: Path, quality: dict) -> Path:
    write_gguf(tmp_path / "moe.gguf", architecture="qwen3moe", expert_count=8, expert_used_count=4)
    (tmp_path / "text.txt").write_text("some text " * 200)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "k", "target": "moe.gguf", "quality": quality}))
    return path


def test_kld_runs_on_the_built_in_text_by_default_and_max_kld_needs_kld(tmp_path):
    spec = load_spec(
        write_study(tmp_path, {"scorer": "kld", "floor": 0.9, "text_file": "text.txt", "max_kld": 0.05})
    )
    assert (spec.quality.scorer, spec.quality.floor, spec.quality.max_kld) == ("kld", 0.9, 0.05)
    assert (
        load_spec(write_study(tmp_path, {"scorer": "kld"})).quality.text_file == builtin_text()
    )  # the default
    for quality, message in [
        ({"scorer": "perplexity"}, "quality.text_file: the perplexity scorer needs a text file"),
        ({"scorer": "agreement", "max_kld": 0.1}, "quality.max_kld: only the kld scorer"),
    ]:
        with pytest.raises(UserError, match=message):
            load_spec(write_study(tmp_path, quality))


@pytest.mark.llama
def test_kld_is_zero_at_the_default_expert_count_and_grows_as_experts_drop(
    synthetic_models, llama_bin_dir, tmp_path
):
    """Expert reduction changes the model: the scorer must see it, and see nothing when nothing changed."""
    target = synthetic_models.path("moe-target")
    text = tmp_path / "text.txt"
    text.write_text(
        inspect.getsource(tuner.measurement.server_process)
    )  # Python source: what the synthetic models know
    flags = ["--model", str(target), "--threads", "1"]
    base = save_kld_base(flags, text, tmp_path / "base.bin", ctx=128, chunks=4, bin_dir=llama_bin_dir)
    assert base.is_file() and not list(tmp_path.glob("*.tmp"))
    assert save_kld_base(flags, text, base, bin_dir=llama_bin_dir) == base  # saved once: not run again

    def at(experts: int) -> dict:
        return measure_kld(
            [*flags, "--override-kv", f"llama.expert_used_count=int:{experts}"],
            base,
            ctx=128,
            bin_dir=llama_bin_dir,
        )

    default = at(4)  # the synthetic MoE's expert_used_count
    # nothing changed: a KLD at the resolution of the saved base's 16-bit log-probabilities (llama-perplexity
    # printed 0.000001 on one host, 0.000000 on others), and the same top token but where the 16-bit base
    # rounds a near-tie into a tie (on an AMD EPYC host: 1 position of 252, with identical flags too)
    assert default["same_top"] >= 0.99 and default["mean_kld"] <= 1e-5
    fewer = [at(n) for n in (2, 1)]
    assert 0 < fewer[0]["mean_kld"] < fewer[1]["mean_kld"]
    assert default["same_top"] > fewer[0]["same_top"] >= fewer[1]["same_top"]


@pytest.mark.llama
def test_a_study_scored_by_kld_stores_mean_kld_and_refuses_what_exceeds_max_kld(tmp_path, synthetic_models):
    from tuner.prepare import prepare
    from tuner.run.objective import StudyObjective
    from tuner.run.study_start import open_study
    from tuner.storage import store
    from tuner.storage.records import changes

    text = tmp_path / "text.txt"
    text.write_text(inspect.getsource(tuner.measurement.server_process))
    path = tmp_path / "study.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "kld",
                "target": str(synthetic_models.path("moe-target")),
                "search_space": {"overrides": {"spec_type": "none", "threads": 1, "temperature": 0.0}},
                "workload": {"suites": ["code"], "n_predict": 16},
                "measurement": {"warmup": 0, "repetitions": 1, "ctx_size": 512, "trial_timeout_s": 120},
                "quality": {"scorer": "kld", "floor": 0.5, "max_kld": 0.0005, "text_file": str(text)},
                "storage": f"sqlite:///{tmp_path / 'studies.db'}",
                "sampler": {"name": "tpe", "prune": False},
            }
        )
    )
    ctx = prepare(load_spec(path), progress=Progress.quiet())
    study = open_study(ctx)
    study.enqueue_trial(
        {"spec_type": "none", "experts": ctx.space.default_experts, "threads": 1},
        user_attrs={store.ROLE: "baseline"},
    )
    study.enqueue_trial({"spec_type": "none", "experts": 1, "threads": 1})
    study.optimize(StudyObjective(ctx, study, progress=Progress.quiet()), n_trials=2)
    full, one = store.read_trials(study)
    assert full.scores == {
        "mean_kld": 0.0,
        "same_top": 1.0,
        "repeated_output": full.scores["repeated_output"],
    }
    assert full.metrics.quality == 1.0 and full.feasible
    assert one.scores["mean_kld"] > 0.0005 and one.metrics.quality == one.scores["same_top"] > 0.5
    assert not one.feasible  # above the floor, but over max_kld
    from tuner.output.analysis import trials_frame

    frame = trials_frame([full, one])  # the report's trials.csv carries them
    assert list(frame["score_mean_kld"]) == [0.0, one.scores["mean_kld"]]
    assert len(list(ctx.log_dir.glob("kld-base-*.bin"))) == 1  # the base logits, saved once
    assert len(store.kld_cache(study)) == 1  # the baseline model is not scored against itself
    # the ceiling and the scored text are part of what makes two studies comparable
    stored = store.read_study_record(study)
    assert stored.quality["max_kld"] == 0.0005 and stored.comparability()["quality.text"]
    text.write_text(text.read_text() + "\n# changed\n")
    assert (
        "quality.text"
        in changes(
            stored, prepare(load_spec(path), progress=Progress.quiet()).study_record(stored.created_by)
        )[0]
    )
