"""The kld scorer: study fields, llama-perplexity's summary lines, and KLD on the synthetic MoE target."""

import inspect
from pathlib import Path

import pytest
import yaml

import tuner.runner
from gguf_factory import write_gguf
from tuner.errors import UserError
from tuner.quality import MEAN_KLD, SAME_TOP, measure_kld, save_kld_base
from tuner.spec import load_spec

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


def test_kld_needs_a_text_file_and_max_kld_needs_kld(tmp_path):
    spec = load_spec(write_study(tmp_path, {"scorer": "kld", "floor": 0.9, "text_file": "text.txt", "max_kld": 0.05}))
    assert (spec.quality.scorer, spec.quality.floor, spec.quality.max_kld) == ("kld", 0.9, 0.05)
    for quality, message in [({"scorer": "kld"}, "quality.text_file: the kld scorer needs a text file"),
                             ({"scorer": "agreement", "max_kld": 0.1}, "quality.max_kld: only the kld scorer")]:
        with pytest.raises(UserError, match=message):
            load_spec(write_study(tmp_path, quality))


@pytest.mark.llama
def test_kld_is_zero_at_the_default_expert_count_and_grows_as_experts_drop(synthetic_models, llama_bin_dir, tmp_path):
    """Expert reduction changes the model: the scorer must see it, and see nothing when nothing changed."""
    target = synthetic_models.path("moe-target")
    text = tmp_path / "text.txt"
    text.write_text(inspect.getsource(tuner.runner))  # Python source: what the synthetic models know
    flags = ["--model", str(target), "--threads", "1"]
    base = save_kld_base(flags, text, tmp_path / "base.bin", ctx=128, chunks=4, bin_dir=llama_bin_dir)
    assert base.is_file() and not list(tmp_path.glob("*.tmp"))
    assert save_kld_base(flags, text, base, bin_dir=llama_bin_dir) == base  # saved once: not run again

    def at(experts: int) -> dict:
        return measure_kld([*flags, "--override-kv", f"llama.expert_used_count=int:{experts}"], base, ctx=128,
                           bin_dir=llama_bin_dir)

    default = at(4)  # the synthetic MoE's expert_used_count
    assert default == {"mean_kld": 0.0, "same_top": 1.0}
    fewer = [at(n) for n in (2, 1)]
    assert 0 < fewer[0]["mean_kld"] < fewer[1]["mean_kld"]
    assert 1.0 > fewer[0]["same_top"] >= fewer[1]["same_top"]
