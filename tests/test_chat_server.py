"""Conversations on a real llama-server: turn by turn through the synthetic family's chat template,
the prompt cache reused from turn to turn, and the tuner's figures against llama.cpp's own client,
the request loop of the pinned ``tools/server/bench/speed-bench/speed_bench.py``."""

from __future__ import annotations

import importlib.util
import statistics
import sys
import types

from tuner.knobs.config import TrialConfig
from tuner.machine.llama_build import binary, source_dir
from tuner.machine.topology import read_topology
from tuner.measurement.launch import LaunchContext, build_server_command
from tuner.measurement.measure import MeasurementSettings, run_workload, summarize
from tuner.measurement.server_process import LlamaServer, free_port
from tuner.measurement.workload import Workload, load_workload

N_PREDICT = 32


def server_argv(models, spec_type="draft-simple", chat=True) -> list[str]:
    """The argv the tuner launches (and export writes) for the synthetic target with its large draft."""
    ctx = LaunchContext(
        server_binary=binary("llama-server"),
        target=models.path("target"),
        drafts={"draft-large": models.path("draft-large")},
        expert_override_key=None,
        topology=read_topology(),
        numactl=None,
        ctx_size=2048,
        chat=chat,
    )
    config = TrialConfig(
        spec_type=spec_type,
        draft="draft-large" if spec_type == "draft-simple" else None,
        draft_max=4,
        threads=1,
    )
    return build_server_command(config, ctx).argv


def test_a_conversation_is_measured_turn_by_turn_with_the_prompt_cache(synthetic_models, tmp_path):
    workload = Workload(load_workload(["chat-agent"], tmp_path).prompts[:1])
    settings = MeasurementSettings(warmup=0, repetitions=1, n_predict=N_PREDICT)
    argv = server_argv(synthetic_models)
    assert "--jinja" in argv
    with LlamaServer(argv, free_port(), tmp_path / "server.log", ready_timeout_s=90) as server:
        samples = run_workload(server, workload, settings, temperature=0.0, speculative=True)
    assert [(s.prompt_id, s.turn, s.key) for s in samples] == [
        ("agent-stack", 1, "agent-stack"),
        ("agent-stack", 2, "agent-stack#2"),
        ("agent-stack", 3, "agent-stack#3"),
    ]
    assert all(0 < s.predicted_n <= N_PREDICT for s in samples)
    assert samples[0].cached_n == 0  # a fresh server: nothing cached yet
    # each later turn starts with the earlier ones: the server reuses their cached prefix
    assert all(s.cached_n > 0 for s in samples[1:])
    assert sum(s.draft_n for s in samples) > 0
    scores = summarize(samples, settings)
    assert set(scores.per_turn_tokens_per_second) == {1, 2, 3}


def load_speed_bench(monkeypatch):
    """The pinned speed_bench.py, its dataset loader aside (``datasets`` is a stand-in: we hand it
    the same conversations the tuner measures); both modules leave ``sys.modules`` with the test."""
    path = source_dir() / "tools" / "server" / "bench" / "speed-bench" / "speed_bench.py"
    stand_in = types.ModuleType("datasets")
    stand_in.get_dataset_config_names = stand_in.load_dataset = None
    if "datasets" not in sys.modules:
        monkeypatch.setitem(sys.modules, "datasets", stand_in)
    spec = importlib.util.spec_from_file_location("speed_bench", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "speed_bench", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_tuners_figures_agree_with_llama_cpps_speed_bench(synthetic_models, tmp_path, monkeypatch):
    """Same server, same conversations (user turns only, as speed_bench sends them), interleaved passes:
    each conversation's decoded tokens and the drafted and accepted counts are identical (greedy decoding), and
    the per-category decode rate, the same figure of llama.cpp's timings taken by each side, agrees within a
    factor a unit or a counting mistake would break (a second, milliseconds, prompt tokens) and a busy host's
    noise between two passes does not (the best of three passes each)."""
    bench = load_speed_bench(monkeypatch)
    workload = load_workload(["chat-summarize"], tmp_path)  # user turns only: speed_bench's shape
    assert all(role == "user" for p in workload.prompts for role, _ in p.messages)
    samples_sb = [
        bench.Sample(id=p.id, category=p.suite, turns=[p.messages[-1][1], *p.turns]) for p in workload.prompts
    ]
    settings = MeasurementSettings(warmup=0, repetitions=1, n_predict=N_PREDICT)
    extra = {"temperature": 0.0, "seed": settings.seed, "cache_prompt": True}
    ours, theirs, decoded = [], [], []
    with LlamaServer(
        server_argv(synthetic_models), free_port(), tmp_path / "s.log", ready_timeout_s=90
    ) as server:
        endpoint = f"{server.url}/v1/chat/completions"
        for round_ in range(3):  # interleaved, each side first in turn
            for side in ("ours", "theirs") if round_ % 2 == 0 else ("theirs", "ours"):
                if side == "ours":
                    ours.append(run_workload(server, workload, settings, temperature=0.0))
                    continue
                results = [bench.run_one(s, endpoint, None, N_PREDICT, extra, 120.0) for s in samples_sb]
                assert all(r.ok for r in results), [r.error for r in results]
                theirs.append(bench.summarize_group("chat-summarize", results))
                decoded.append({r.id: r.completion_tokens for r in results})
    # speed_bench's figure: the mean over conversations of each one's tokens over its decode time
    tuner_rates = [
        statistics.fmean(
            1000.0
            * sum(s.predicted_n for s in run if s.prompt_id == p.id)
            / sum(s.predicted_ms for s in run if s.prompt_id == p.id)
            for p in workload.prompts
        )
        for run in ours
    ]
    for run, summary, tokens in zip(ours, theirs, decoded):
        assert sum(s.draft_n for s in run) == summary["draft_n"] > 0
        assert sum(s.draft_n_accepted for s in run) == summary["accepted"]
        assert {
            p.id: sum(s.predicted_n for s in run if s.prompt_id == p.id) for p in workload.prompts
        } == tokens
    ratio = max(tuner_rates) / max(t["avg_pred_t_s"] for t in theirs)
    print(
        "tuner",
        [round(r, 1) for r in tuner_rates],
        "speed_bench",
        [round(t["avg_pred_t_s"], 1) for t in theirs],
    )
    print("acceptance", [round(t["accept_rate"], 3) for t in theirs])
    assert 1 / 1.5 < ratio < 1.5
