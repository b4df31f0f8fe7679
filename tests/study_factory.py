"""Studies built directly with Optuna's API, stored exactly as ``tuner.study`` stores them.

Report, compare, export and dashboard read only the storage, so their tests need
studies with realistic attrs, not a llama.cpp run per trial. ``make_study`` writes one:
the study attrs (fingerprint, build, target, objectives, quality floor, reference) and
one Optuna trial per ``Row`` with the params that applied, the values in objective
order and the user attrs a measured (or failed) trial carries. The argv comes from the
real argv builder, so it is the command a trial would have launched.
"""

from __future__ import annotations

import copy
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pytest
from conftest import running_llama_processes
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from tuner.host import numactl_path
from tuner.topology import read_topology
from tuner.launch import LaunchContext, build_server_argv
from tuner.space import TrialConfig

OBJECTIVES = ["tokens_per_second", "acceptance", "quality"]
SUITES = ("code", "prose")

DISTRIBUTIONS = {
    "spec_type": CategoricalDistribution(("none", "draft-simple", "ngram-simple")),
    "draft": CategoricalDistribution(("draft-large", "draft-small")),
    "draft_max": CategoricalDistribution((1, 2, 3, 4, 6, 8, 12, 16)),
    "draft_p_min": FloatDistribution(0.0, 0.9),
    "temperature": FloatDistribution(0.0, 1.0),
    "experts": IntDistribution(1, 8),
    "numa": CategoricalDistribution(("none", "interleave", "bind", "distribute")),
    "numa_node": CategoricalDistribution((0,)),
    "threads": IntDistribution(1, 2),
}

FINGERPRINT = {
    "cpu_model": "AMD EPYC 9654 96-Core Processor",
    "logical_cpus": 2,
    "physical_cores": 2,
    "numa_nodes": ["0-1"],
    "memory_gib": 16,
    "llama_commit": "0c1e570",
    "llama_build_flags": "-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF",
    "threads_per_core": 1,
    "simd_flags": ["avx2", "fma"],
    "llama_build_number": 1,
    "hostname": "bench-1",
    "bandwidth_bytes_per_s": 20e9,
}

TARGET = {
    "path": "/srv/models/target.gguf",
    "architecture": "llama",
    "name": "synthetic target",
    "weights_bytes": 200_000_000,  # with 20 GB/s: a 100 t/s ceiling without speculation
    "file_size_bytes": 201_000_000,
    "quantization": "Q8_0",
    "is_moe": False,
    "expert_count": None,
    "expert_used_count": None,
    "expert_override_key": None,
}

MOE_TARGET = {
    **TARGET,
    "path": "/srv/models/moe-target.gguf",
    "architecture": "qwen3moe",
    "name": "synthetic moe",
    "is_moe": True,
    "expert_count": 8,
    "expert_used_count": 4,
    "expert_override_key": "qwen3moe.expert_used_count",
    "expert_weights_bytes": 160_000_000,
}


@dataclass(frozen=True)
class Row:
    """One trial to store: its configuration and what it measured (or why it failed)."""

    config: dict
    tokens_per_second: float = 0.0
    acceptance: float = 0.0
    quality: float = 1.0
    per_suite: dict | None = None  # default: every suite at tokens_per_second
    role: str | None = None
    cv: float = 0.02
    failure: str | None = None  # a FailureReason value: the trial is stored as FAIL


@dataclass(frozen=True)
class Paths:
    """Where the argv's binary and models live (fake for data tests, real for launch tests)."""

    server: Path = Path("/opt/llama/bin/llama-server")
    target: Path = Path("/srv/models/target.gguf")
    drafts: dict = field(default_factory=lambda: {
        "draft-large": Path("/srv/models/draft-large.gguf"),
        "draft-small": Path("/srv/models/draft-small.gguf"),
    })
    expert_override_key: str | None = None
    ctx_size: int = 1024


def launch_context(paths: Paths) -> LaunchContext:
    return LaunchContext(
        server_binary=paths.server,
        target=paths.target,
        drafts=dict(paths.drafts),
        expert_override_key=paths.expert_override_key,
        topology=read_topology(),
        numactl=numactl_path(),
        ctx_size=paths.ctx_size,
    )


def baseline_row(tokens_per_second: float = 50.0, threads: int = 2) -> Row:
    return Row({"spec_type": "none", "temperature": 0.0, "numa": "none", "threads": threads},
               tokens_per_second, role="baseline", cv=0.01)


def demo_rows() -> list[Row]:
    """A small dense study: baseline, drafts over K, n-grams, temperature, threads, failures."""
    def spec(draft, k, tps, acc, quality=1.0, temperature=0.0, threads=2, code=None, prose=None):
        per_suite = {"code": code or tps * 1.2, "prose": prose or tps * 0.8}
        return Row({"spec_type": "draft-simple", "draft": draft, "draft_max": k, "temperature": temperature,
                    "numa": "none", "threads": threads}, tps, acc, quality, per_suite)

    return [
        baseline_row(50.0),
        spec("draft-small", 4, 80.0, 0.70, code=110.0, prose=55.0),
        spec("draft-small", 8, 95.0, 0.62, code=130.0, prose=52.0),
        spec("draft-small", 16, 70.0, 0.40, code=100.0, prose=45.0),
        spec("draft-large", 4, 75.0, 0.80, code=90.0, prose=62.0),
        spec("draft-large", 8, 88.0, 0.75, code=115.0, prose=58.0),
        spec("draft-small", 8, 120.0, 0.55, quality=0.90, temperature=0.7),  # fast but below the floor
        spec("draft-small", 2, 60.0, 0.85, threads=1),
        Row({"spec_type": "ngram-simple", "draft_max": 4, "temperature": 0.0, "numa": "none", "threads": 2},
            58.0, 0.30, 1.0, {"code": 52.0, "prose": 64.0}),
        Row({"spec_type": "none", "temperature": 0.0, "numa": "distribute", "threads": 1}, 30.0, 0.0, 1.0),
        Row({"spec_type": "draft-simple", "draft": "draft-large", "draft_max": 12, "temperature": 0.0,
             "numa": "none", "threads": 2}, failure="out_of_memory"),
    ]


def params_of(config: dict) -> tuple[dict, dict]:
    """The Optuna params (only the knobs that applied) and their distributions."""
    params = {k: v for k, v in config.items() if k in DISTRIBUTIONS}
    return params, {k: DISTRIBUTIONS[k] for k in params}


def samples_of(row: Row, repetitions: int = 2) -> list[dict]:
    per_suite = row.per_suite or {s: row.tokens_per_second for s in SUITES}
    samples = []
    for repetition in range(repetitions):
        for suite, tps in per_suite.items():
            drafted = 40 if row.config.get("spec_type", "none") != "none" else 0
            samples.append({
                "prompt_id": f"{suite}-1", "suite": suite, "repetition": repetition, "predicted_n": 64,
                "predicted_ms": 64_000.0 / tps if tps else 0.0, "tokens_per_second": tps,
                "draft_n": drafted, "draft_n_accepted": round(drafted * row.acceptance),
            })
    return samples


def make_study(
    storage: str | optuna.storages.BaseStorage,
    name: str = "demo",
    rows: list[Row] | None = None,
    *,
    fingerprint: dict | None = None,
    target: dict | None = None,
    floor: float = 0.99,
    paths: Paths = Paths(),
    spec_path: str = "/work/studies/demo.yaml",
    measurement: dict | None = None,
) -> optuna.Study:
    """A finished study in ``storage`` as ``tuner run`` would have left it."""
    rows = demo_rows() if rows is None else rows
    study = optuna.create_study(study_name=name, storage=storage, directions=["maximize"] * len(OBJECTIVES))
    ctx = launch_context(paths)
    baseline = next((r for r in rows if r.role == "baseline"), None)
    attrs = {
        "fingerprint": copy.deepcopy(FINGERPRINT if fingerprint is None else fingerprint),
        "build": {"commit": "0c1e570", "cmake_flags": "-DCMAKE_BUILD_TYPE=Release", "source": "llama-cpp-python 0.3.36"},
        "target": copy.deepcopy(TARGET if target is None else target),
        "drafts": {n: {"path": str(p), "architecture": "llama"} for n, p in paths.drafts.items()},
        "space": {k: ["Choices", {"values": list(d.choices)}] for k, d in DISTRIBUTIONS.items()
                  if isinstance(d, CategoricalDistribution)},
        "objectives": OBJECTIVES,
        "quality": {"scorer": "agreement", "floor": floor},
        "spec_path": spec_path,
        "workload": [f"{s}-1" for s in SUITES],
        "measurement": measurement or {"warmup": 1, "repetitions": 2, "n_predict": 64, "seed": 42, "noise_cv": 0.1},
    }
    if baseline is not None:
        attrs["reference"] = {"trial": rows.index(baseline), "tokens": {}, "texts": {},
                              "tokens_per_second": baseline.tokens_per_second}
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    base_tps = baseline.tokens_per_second if baseline else None
    for number, row in enumerate(rows):
        study.add_trial(stored_trial(row, ctx, base_tps, floor, port=40000 + number))
    return study


def stored_trial(row: Row, ctx: LaunchContext, base_tps: float | None, floor: float, port: int) -> optuna.trial.FrozenTrial:
    config = TrialConfig(**row.config)
    params, distributions = params_of(row.config)
    argv = build_server_argv(config, ctx) + ["--host", "127.0.0.1", "--port", str(port)]
    attrs = {"config": config.as_dict(), "argv": argv}
    if row.role:
        attrs["role"] = row.role
    if row.failure:
        attrs.update({"failure_reason": row.failure, "failure_detail": "llama-server ended before ready (exit code 1)",
                      "log_tail": "ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer"})
        return optuna.trial.create_trial(params=params, distributions=distributions, user_attrs=attrs,
                                         state=optuna.trial.TrialState.FAIL)
    speedup = row.tokens_per_second / base_tps if base_tps else 1.0
    metrics = {"tokens_per_second": row.tokens_per_second, "acceptance": row.acceptance,
               "quality": row.quality, "speedup": speedup}
    samples = samples_of(row)
    attrs.update({
        "metrics": metrics,
        "speedup": speedup,
        "cv": row.cv,
        "noisy": row.cv > 0.1,
        "drafted": sum(s["draft_n"] for s in samples),
        "accepted": sum(s["draft_n_accepted"] for s in samples),
        "per_suite_tokens_per_second": row.per_suite or {s: row.tokens_per_second for s in SUITES},
        "samples": samples,
        "outputs": {f"{s}-1": "def add(a, b):\n    return a + b" for s in SUITES},
        "constraint_quality": floor - row.quality,
    })
    return optuna.trial.create_trial(params=params, distributions=distributions, user_attrs=attrs,
                                     values=[metrics[m] for m in OBJECTIVES],
                                     system_attrs={"constraints": [floor - row.quality]})  # what the sampler stores


# ------------------------------------------------------------------ process hygiene, this run only


def own_descendants() -> set[int]:
    """Pids of every live process descending from this pytest process."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [os.getpid()]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


@pytest.fixture(autouse=True)
def no_llama_process_left_behind():
    """conftest's check, limited to processes this test run started.

    The shared check kills any llama.cpp process that appears during a test on the whole
    machine, including other users' servers; this one only looks at our descendants.
    """
    yield
    mine = own_descendants()
    leftover = [line for line in running_llama_processes() if int(line.split()[0]) in mine]
    for line in leftover:
        os.kill(int(line.split()[0]), signal.SIGKILL)
    assert not leftover, f"llama.cpp processes left running: {leftover}"
