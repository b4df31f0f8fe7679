"""`tuner export`: the policy's choice, the files it writes, and that llama-server runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import optuna
import pytest
import yaml

from fake_llama_server import get_json, wait_for_json
from study_factory import Paths, Row, baseline_row, make_study
from study_factory import no_llama_process_left_behind  # noqa: F401  (overrides conftest's machine-wide check)
from tuner.cli import main
from tuner.errors import UserError
from tuner.export import Export, build_export, choose, merge_preset, preset_lines, shell_script
from tuner.llama_build import binary
from tuner.paths import models_dir
from tuner.analysis import trials_frame
from tuner.runner import free_port


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    """One SQLite file for the module: creating an Optuna schema costs seconds on a busy box."""
    url = f"sqlite:///{tmp_path_factory.mktemp('storage') / 'studies.db'}"
    make_study(url, "demo")
    return url


@pytest.fixture
def demo():
    return make_study(optuna.storages.InMemoryStorage(), "demo")


# ------------------------------------------------------------------ choosing


def test_policies_choose_among_trials_that_meet_the_floor(demo):
    frame = trials_frame(demo)
    assert choose(demo, frame)[0] == 2  # 95 t/s; trial 6 is faster (120) but below the floor
    assert choose(demo, frame, min_acceptance=0.75)[0] == 5  # 88 t/s at 0.75
    assert choose(demo, frame, trial=4) == (4, "trial 4 chosen with --trial")
    with pytest.raises(UserError, match=r"--trial 6: not a complete trial of 'demo' that meets the quality floor"):
        choose(demo, frame, trial=6)
    with pytest.raises(UserError, match=r"--min-acceptance 0.95: no feasible trial .* \(best feasible acceptance 0.85\)"):
        choose(demo, frame, min_acceptance=0.95)


def test_knee_policy_pays_little_quality_for_much_speed():
    rows = [Row({"spec_type": "none", "temperature": 0.0, "experts": n, "numa": "none", "threads": 2}, tps, 0.0, q,
                role="baseline" if n == 4 else None)
            for n, tps, q in [(4, 50.0, 1.0), (3, 60.0, 0.99), (2, 75.0, 0.97), (1, 80.0, 0.90)]]
    study = make_study(optuna.storages.InMemoryStorage(), "moe", rows, floor=0.85)
    frame = trials_frame(study)
    assert choose(study, frame, "max-tps")[0] == 3
    assert choose(study, frame, "knee")[0] == 2


def test_no_feasible_trial_is_a_one_line_error(storage, capsys):
    rows = [baseline_row(50.0), Row({"spec_type": "none", "temperature": 0.9, "numa": "none", "threads": 2}, 70.0, 0.0, 0.5)]
    rows[0] = Row(rows[0].config, 50.0, quality=0.5, role="baseline")
    make_study(storage, "hopeless", rows)
    assert main(["export", "hopeless", "--storage", storage, "--no-confirm"]) == 2
    err = capsys.readouterr().err
    assert err == ("tuner export: error: study 'hopeless' has no feasible trial (2 complete, none meets the quality "
                   "floor 0.99); run more trials or lower quality.floor in the study file\n")


# ------------------------------------------------------------------ what is written


def test_files_script_json_yaml_and_preset(storage, tmp_path, capsys):
    out, preset = tmp_path / "export", tmp_path / "models-preset.ini"
    assert main(["export", "demo", "--storage", storage, "--no-confirm", "--out", str(out), "--preset", str(preset)]) == 0
    printed = capsys.readouterr().out
    assert "chosen: trial 2 (highest tokens/s among trials that meet the quality floor)" in printed
    assert "best on code: trial 2, draft-small, K=8, T=0.0: 130.0 tokens/s" in printed
    assert "best on prose: trial 8, ngram-simple, K=4, T=0.0: 64.0 tokens/s" in printed

    script = (out / "serve.sh").read_text()
    assert os.access(out / "serve.sh", os.X_OK)
    exec_line = script.splitlines()[-1]
    assert exec_line.startswith("exec ")  # then numactl and its CPU list, when this machine has numactl
    assert " /opt/llama/bin/llama-server --model /srv/models/target.gguf " in exec_line
    assert "--spec-draft-n-max 8 --temp 0 --host" in exec_line
    assert exec_line.endswith('--host "${LLAMA_ARG_HOST:-127.0.0.1}" --port "${LLAMA_ARG_PORT:-8080}" "$@"')

    record = json.loads((out / "config.json").read_text())
    assert record == yaml.safe_load((out / "config.yaml").read_text())
    assert (record["trial"], record["config"]["draft"], record["config"]["draft_max"]) == (2, "draft-small", 8)
    assert record["metrics"]["tokens_per_second"] == 95.0 and record["confirmation"] is None
    assert record["argv"][-2:] == ["--temp", "0"] and "--port" not in record["argv"]
    assert [(r["suite"], r["trial"], r["draft_max"]) for r in record["per_content_type"]] == [("code", 2, 8), ("prose", 8, 4)]
    assert record["llama_cpp"]["commit"] == "0c1e570" and record["preset_section"] == "demo"

    text = preset.read_text()
    assert text.startswith("version = 1\n")
    assert "[demo]\n" in text and "model = /srv/models/target.gguf\n" in text
    assert "spec-draft-n-max = 8\n" in text and "no-webui = true\n" in text and "temp = 0\n" in text


def quoted_export(argv: list[str]) -> Export:
    return Export(study="big model", trial=3, policy="max-tps", config={"temperature": 0.0},
                  metrics={"tokens_per_second": 10.0, "speedup": 1.5, "acceptance": 0.5, "quality": 1.0},
                  argv=argv, per_content_type=[], llama_cpp={"commit": "0c1e570"}, machine={"cpu_model": "x"})


def test_script_quotes_every_argument():
    export = quoted_export(["/opt/my llama/llama-server", "--model", "/m/it's.gguf", "--temp", "0"])
    exec_line = shell_script(export).splitlines()[-1]
    assert exec_line.startswith("""exec '/opt/my llama/llama-server' --model '/m/it'"'"'s.gguf' --temp 0 --host""")


def test_preset_turns_numactl_pinning_into_cpu_mask_and_keeps_policy_as_a_comment():
    export = quoted_export([
        "/usr/bin/numactl", "--physcpubind=0-3", "--interleave=all", "/opt/llama/llama-server", "--model", "/m/t.gguf",
        "--threads", "4", "--no-webui", "--numa", "numactl", "--override-kv", "qwen3moe.expert_used_count=int:3",
        "--temp", "0.7",
    ])
    lines = preset_lines(export)
    assert lines[0] == "[big-model]"  # the study name made INI-safe
    assert "; tuned under numactl --interleave=all: start the router with it to keep that memory policy" in lines
    options = [line for line in lines if not line.startswith((";", "["))]
    assert options == ["cpu-mask = 0xf", "cpu-strict = 1", "model = /m/t.gguf", "threads = 4", "no-webui = true",
                       "override-kv = qwen3moe.expert_used_count=int:3", "temp = 0.7"]
    with pytest.raises(UserError, match="contains ; # or a newline"):
        preset_lines(quoted_export(["/opt/llama-server", "--model", "/m/a#b.gguf"]))
    with pytest.raises(UserError, match="repeats --override-kv"):
        preset_lines(quoted_export(["/opt/llama-server", "--override-kv", "a=int:1", "--override-kv", "b=int:2"]))


def test_preset_file_keeps_other_sections_and_replaces_its_own(tmp_path):
    path = tmp_path / "models-preset.ini"
    path.write_text("version = 1\n\n[*]\nc = 8192\n\n[hand-written]\nmodel = /m/x.gguf ; mine\n")
    merge_preset(path, "a", ["[a]", "model = /m/a.gguf"])
    merge_preset(path, "b", ["[b]", "model = /m/b.gguf"])
    merge_preset(path, "a", ["[a]", "model = /m/a2.gguf"])
    assert path.read_text() == (
        "version = 1\n\n[*]\nc = 8192\n\n[hand-written]\nmodel = /m/x.gguf ; mine\n\n"
        "[a]\nmodel = /m/a2.gguf\n\n[b]\nmodel = /m/b.gguf\n"
    )


# ------------------------------------------------------------------ real llama-server


def synthetic(name: str) -> Path:
    path = models_dir() / "synthetic" / f"{name}.gguf"
    assert path.is_file(), f"{path} missing: the synthetic_models fixture should have generated it"
    return path


def real_paths() -> Paths:
    return Paths(server=binary("llama-server"), target=synthetic("target"),
                 drafts={"draft-large": synthetic("draft-large"), "draft-small": synthetic("draft-small")})


def real_study(storage: str, tmp_path: Path, name: str) -> optuna.Study:
    """A study whose commands launch the pinned server on the synthetic family, with a tiny workload."""
    suite = tmp_path / "prompts.yaml"
    suite.write_text("prompts:\n  - id: code-1\n    text: \"def add(a, b):\\n    return\"\n"
                     "  - id: code-2\n    text: \"for i in range(10):\\n    print(\"\n")
    paths = real_paths()
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({
        "name": name, "target": str(paths.target), "drafts": [str(p) for p in paths.drafts.values()],
        "workload": {"suites": ["prompts.yaml"], "n_predict": 16},
        "measurement": {"warmup": 1, "repetitions": 1, "ctx_size": 1024, "trial_timeout_s": 60},
        "storage": storage,
    }))
    rows = [baseline_row(50.0),
            Row({"spec_type": "draft-simple", "draft": "draft-small", "draft_max": 4, "temperature": 0.0,
                 "numa": "none", "threads": 2}, 80.0, 0.7)]
    return make_study(storage, name, rows, paths=paths, spec_path=str(spec),
                      measurement={"warmup": 1, "repetitions": 1, "n_predict": 16, "seed": 42, "noise_cv": 0.1})


def post_json(url: str, body: dict, timeout: float = 60.0) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.load(resp)


def start(argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    with open(log, "wb") as fh:
        return subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)


def stop(proc: subprocess.Popen) -> None:
    """SIGKILL the whole group (router children included) and reap the leader."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.llama
@pytest.mark.slow
def test_exported_script_serves_the_synthetic_family(synthetic_models, storage, tmp_path, capsys):
    real_study(storage, tmp_path, "served")
    out, preset = tmp_path / "export", tmp_path / "models-preset.ini"
    assert main(["export", "served", "--storage", storage, "--no-confirm", "--out", str(out), "--preset", str(preset)]) == 0
    port = free_port()
    proc = start([str(out / "serve.sh")], tmp_path / "serve.log", env={**os.environ, "LLAMA_ARG_PORT": str(port)})
    try:
        wait_for_json(proc, f"http://127.0.0.1:{port}/health", 90, "llama-server")
        answer = post_json(f"http://127.0.0.1:{port}/completion",
                           {"prompt": "def add(a, b):\n    return", "n_predict": 16, "temperature": 0})
        assert answer["timings"]["predicted_n"] > 0
        assert answer["timings"].get("draft_n", 0) > 0, "the exported command did not speculate"
    finally:
        stop(proc)
    log = (tmp_path / "serve.log").read_text()
    assert "draft-small.gguf" in log


@pytest.mark.llama
@pytest.mark.slow
def test_preset_file_is_accepted_by_the_llama_server_router(synthetic_models, storage, tmp_path):
    real_study(storage, tmp_path, "routed")
    preset = tmp_path / "models-preset.ini"
    preset.write_text("version = 1\n\n[*]\nc = 1024\n")
    frame = trials_frame(optuna.load_study(study_name="routed", storage=storage))
    study = optuna.load_study(study_name="routed", storage=storage)
    merge_preset(preset, "routed", preset_lines(build_export(study, frame, 1, "max-tps")))
    port = free_port()
    proc = start([str(binary("llama-server")), "--models-preset", str(preset), "--host", "127.0.0.1",
                  "--port", str(port)], tmp_path / "router.log")
    try:
        wait_for_json(proc, f"http://127.0.0.1:{port}/health", 90, "llama-server")
        models = get_json(f"http://127.0.0.1:{port}/models")
        assert "routed" in [m["id"] for m in models["data"]]
        answer = post_json(f"http://127.0.0.1:{port}/v1/completions",
                           {"model": "routed", "prompt": "def add(a, b):\n    return", "max_tokens": 8, "temperature": 0})
        assert answer["choices"][0]["text"] != "" or answer["usage"]["completion_tokens"] > 0
    finally:
        stop(proc)


@pytest.mark.llama
@pytest.mark.slow
def test_confirmation_remeasures_winner_and_baseline_side_by_side(synthetic_models, storage, tmp_path, capsys,
                                                                  monkeypatch):
    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path))  # the confirmation's server logs
    real_study(storage, tmp_path, "confirmed")
    out, preset = tmp_path / "export", tmp_path / "models-preset.ini"
    assert main(["export", "confirmed", "--storage", storage, "--rounds", "2", "--out", str(out),
                 "--preset", str(preset)]) == 0
    printed = capsys.readouterr().out
    assert "confirm round 2/2: winner" in printed
    assert "confirmed speedup: x" in printed and "(recorded x1.60" in printed
    c = json.loads((out / "config.json").read_text())["confirmation"]
    assert c["rounds"] == 2 and len(c["winner_tokens_per_second"]) == len(c["baseline_tokens_per_second"]) == 2
    assert c["drafted"] > 0 and c["speedup"] > 0
    assert c["falls_short"] == ("WARNING: the confirmation falls short" in printed)
    assert (tmp_path / "logs" / "confirmed" / "confirm-winner.log").is_file()
