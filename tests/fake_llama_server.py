"""A stand-in ``llama-server`` for tests that need many fast trials or injected faults.

It speaks the part of llama-server's interface the tuner uses: ``--version`` on stderr,
``--host``/``--port``, ``GET /health`` and ``POST /completion`` with llama.cpp's
``timings``. Speed and acceptance are pure functions of the argv and the prompt, so
different configurations (and content types) measure differently and the same one
always the same; tokens are a pure function of the prompt, the temperature and the
active MoE experts, so greedy trials agree with the baseline. Everything around it
(workers, storage, Optuna, runner, measurement) is real.

Environment (inherited through the tuner, which passes its environment on):
  FAKE_LLAMA_COMMIT    commit printed by ``--version`` (default: the pinned 0c1e570)
  FAKE_LLAMA_HELP      file whose text ``--help`` prints (a build's usage text); unset: none, so nothing is checked
  FAKE_LLAMA_DELAY_S   seconds to sleep in each /completion before decoding (reported as prompt time)
  FAKE_LLAMA_JITTER    each request's rate varies by up to +- this fraction (a noisy machine)
  FAKE_LLAMA_SPEED     factor on every speed (default 1: another build, or a busier machine)
  FAKE_LLAMA_SHORT_K   a prompt containing this text drafts badly: its acceptance falls fast with K
                       (content whose best draft length is short, like prose against code)
  FAKE_LLAMA_LAUNCHES  file to append one JSON line per launch: pid, port, argv
  FAKE_LLAMA_FAULTS    JSON {argv substring: fault}; a launch whose argv (joined by
                       spaces, plus a trailing space) contains the substring shows the
                       fault: launch, exit137, crash, hang, crash_mid_run, http500, nodraft,
                       http200error (an error body with HTTP 200), liar (decode time claimed 10x short),
                       unpinned (--cpu-mask ignored, as upstream once did: threads on every CPU)

``--cpu-mask M --cpu-strict 1`` pins the process to M's CPUs before any thread starts, as llama.cpp pins its own.

Install it as a bin folder's ``llama-server`` with ``install`` below. The process then runs
as ``python .../fake_llama_server.py ARGS``; conftest's leftover check knows it by this
file's name in its command line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PINNED_COMMIT = "0c1e570"
FAULTS = (
    "launch",
    "exit137",
    "crash",
    "hang",
    "crash_mid_run",
    "http500",
    "nodraft",
    "http200error",
    "liar",
    "unpinned",
)
DEFAULT_EXPERTS = 4  # a MoE target's expert_used_count, as write_moe_study writes it


def install(bin_dir: Path) -> Path:
    """Write ``bin_dir/llama-server``, which execs this file with the current interpreter."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "llama-server"
    script.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} "$@"\n'
    )
    script.chmod(0o755)
    return script


def write_study(folder: Path, storage: str, name: str = "t", **fields) -> Path:
    """``folder/study.yaml``: metadata-only models, a two-prompt suite and this stand-in as
    ``llama_cpp.bin_dir``, measured quickly; ``fields`` replace top-level keys. Pruning and
    sentinels are off unless a test asks for them, so a study measures exactly its trials."""
    import yaml  # test side only: the stand-in server itself starts on the standard library
    from gguf_factory import write_gguf

    models = folder / "models"
    models.mkdir(parents=True, exist_ok=True)
    for model in ("target", "draft"):
        if not (models / f"{model}.gguf").exists():
            write_gguf(models / f"{model}.gguf")
    install(folder / "bin")
    (folder / "suite.yaml").write_text(
        yaml.safe_dump(
            {
                "prompts": [
                    {"id": "add", "text": "def add(a, b):\n"},
                    {"id": "greet", "text": "def greet(name):\n"},
                ]
            }
        )
    )
    study = {
        "name": name,
        "target": "models/target.gguf",
        "drafts": ["models/draft.gguf"],
        "search_space": {
            "overrides": {
                "spec_type": ["none", "draft-simple"],
                "draft_max": [2, 3, 4, 5, 6, 8],
                "temperature": 0.0,
                "threads": 1,
            }
        },
        "workload": {"suites": ["suite.yaml"], "n_predict": 8},
        "measurement": {"warmup": 0, "repetitions": 1, "ctx_size": 256, "trial_timeout_s": 5},
        "quality": {"scorer": "agreement", "floor": 0.9},
        "budget": {"trials": 4},
        "storage": storage,
        "sampler": {"name": "tpe", "seed": 1, "prune": False},
        "sentinel": {"every_trials": 1000, "after_busy": 0},  # no reference trials: counts stay the budget's
        "llama_cpp": {"bin_dir": "bin"},
        **fields,
    }
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def demo_warm_start() -> list[dict]:
    """The demo's configurations after its baseline: a draft over K (K=12 is the one
    DEMO_FAULTS kills as out of memory), one above temperature 0 at the K that is fastest
    overall (its tokens change, so it falls below the agreement floor), an n-gram type,
    and, with two cores, a draft and the target alone on one thread."""
    from tuner.machine.topology import read_topology

    top = min(2, read_topology().physical_cores)

    def config(spec_type: str, k: int | None = None, threads: int = top, temperature: float = 0.0) -> dict:
        draft = {"draft": "draft"} if spec_type == "draft-simple" else {}
        return {
            "spec_type": spec_type,
            **draft,
            **({"draft_max": k} if k else {}),
            "temperature": temperature,
            "threads": threads,
        }

    warm = [config("draft-simple", k) for k in (2, 4, 8)]
    warm += [
        config("draft-simple", 3, temperature=0.7),
        config("ngram-simple", 4),
        config("draft-simple", 12),
    ]
    if top > 1:
        warm += [config("draft-simple", 3, threads=1), config("none", threads=1)]
    return warm


DEMO_FAULTS = json.dumps({"--spec-draft-n-max 12 ": "exit137"})


def write_demo_study(
    folder: Path, storage: str, name: str = "demo", warm_start: list[dict] | None = None, **fields
) -> Path:
    """``write_study`` with a code suite and a prose suite, measuring exactly the baseline
    and ``warm_start`` (default ``demo_warm_start()``): the budget leaves the sampler nothing."""
    import yaml

    warm_start = demo_warm_start() if warm_start is None else warm_start
    folder.mkdir(parents=True, exist_ok=True)
    for suite, text in (("code", "def add(a, b):\n"), ("prose", "Once upon a time")):
        (folder / f"{suite}.yaml").write_text(yaml.safe_dump({"prompts": [{"id": suite, "text": text}]}))
    threads = sorted({1, *(w["threads"] for w in warm_start)})
    return write_study(
        folder,
        storage,
        name,
        **{
            "search_space": {
                "overrides": {
                    "spec_type": ["none", "draft-simple", "ngram-simple"],
                    "draft_max": [2, 3, 4, 8, 12],
                    "temperature": [0.0, 0.7],
                    "threads": threads,
                }
            },
            "workload": {"suites": ["code.yaml", "prose.yaml"], "n_predict": 8},
            "measurement": {"warmup": 0, "repetitions": 2, "ctx_size": 256, "trial_timeout_s": 10},
            "warm_start": warm_start,
            "budget": {"trials": 1 + len(warm_start)},
            **fields,
        },
    )


def write_moe_study(folder: Path, storage: str, name: str = "moe") -> Path:
    """``write_study`` on a mixture-of-experts target (8 experts, DEFAULT_EXPERTS used; the
    expert tensors hold 1024 of its 1280 weight bytes), measuring 3, 2 and 1 active experts."""
    import numpy as np
    from gguf_factory import write_gguf

    (folder / "models").mkdir(parents=True, exist_ok=True)
    write_gguf(
        folder / "models" / "moe.gguf",
        architecture="qwen3moe",
        expert_count=8,
        expert_used_count=DEFAULT_EXPERTS,
        tensors={
            "output_norm.weight": np.ones(64, dtype=np.float32),
            "blk.0.ffn_up_exps.weight": np.ones((8, 32), dtype=np.float32),
        },
    )
    warm_start = [{"spec_type": "none", "experts": n, "temperature": 0.0} for n in (3, 2, 1)]
    return write_study(
        folder,
        storage,
        name,
        target="models/moe.gguf",
        drafts=[],
        search_space={
            "overrides": {"spec_type": "none", "experts": [1, 2, 3, 4], "temperature": 0.0, "threads": 1}
        },
        warm_start=warm_start,
        budget={"trials": 1 + len(warm_start)},
        quality={"scorer": "agreement", "floor": 0.7},
    )


BANDWIDTH = 20e9  # bytes/s: what run_study_file's runs record as the host's memory bandwidth


def run_study_file(path: Path, trials: int | None = None, **env: str):
    """Run a study file with the real runner (on the stand-in when the file names it as
    ``llama_cpp.bin_dir``) and return the stored (study, StudyRecord); ``env`` (FAKE_LLAMA_*)
    holds for this run only, and trial logs go beside the study file.

    The fingerprint's memory bandwidth is BANDWIDTH (one point at all cores) instead of the
    host's copy probe: the probe streams 512 MiB at several thread counts for a few seconds
    per run, which a busy shared machine feels, and only the report reads the figures."""
    import pytest

    from tuner.machine.bandwidth import BandwidthCurve
    from tuner.progress import Progress
    from tuner.run.study_loop import run_study
    from tuner.storage.store import open_stored_study
    from tuner.studyfile.spec import load_spec

    spec = load_spec(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TUNER_STORAGE_DIR", str(path.parent / "storage"))
        for var in (
            "FAKE_LLAMA_COMMIT",
            "FAKE_LLAMA_DELAY_S",
            "FAKE_LLAMA_FAULTS",
            "FAKE_LLAMA_SPEED",
            "FAKE_LLAMA_HELP",
        ):
            patch.delenv(var, raising=False)
        for var, value in env.items():
            patch.setenv(var, value)
        patch.setattr(
            "tuner.machine.bandwidth.probe_bandwidth_curve", lambda cores: BandwidthCurve({cores: BANDWIDTH})
        )
        run_study(spec, trials, progress=Progress.quiet())
    return open_stored_study(spec.name, spec.storage)


def launches(path: Path) -> list[dict]:
    """The launches recorded through FAKE_LLAMA_LAUNCHES."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def alive(pid: int) -> bool:
    """Running or stopped; a zombie (dead, awaiting its parent) does not count."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def port_is_free(port: int) -> bool:
    """Whether a server could listen on ``port`` now (SO_REUSEADDR, as llama-server binds)."""
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            return False
    return True


def stop_group(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM a process started with ``start_new_session`` and its group (a router's children
    too), SIGKILL whatever is left after ``timeout_s``, and reap the leader."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.1):
    """Poll ``condition()`` until it returns something truthy; fail the test naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def get_json(url: str, timeout: float = 5.0):
    """GET ``url`` and decode its JSON body; an HTTP error status raises."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


def wait_for_json(proc: subprocess.Popen, url: str, timeout_s: float, what: str):
    """Poll ``url`` until it answers 200 with JSON, failing at once if ``proc`` exited."""

    def answer():
        assert proc.poll() is None, f"{what} exited with {proc.returncode}"
        try:
            return get_json(url, timeout=2.0)
        except (urllib.error.URLError, OSError, ValueError):  # refused, 503 while loading, half-written
            return None

    return wait_for(answer, timeout_s, f"{what} to answer {url}", poll_s=0.2)


def flag(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv[:-1] else default


def fault_for(argv: list[str]) -> str | None:
    joined = " ".join(argv) + " "
    faults = json.loads(os.environ.get("FAKE_LLAMA_FAULTS") or "{}")
    return next((fault for needle, fault in faults.items() if needle in joined), None)


def active_experts(argv: list[str]) -> int | None:
    """The MoE expert count an ``--override-kv ARCH.expert_used_count=int:N`` sets, else None."""
    override = flag(argv, "--override-kv") or ""
    return int(override.rsplit(":", 1)[1]) if ".expert_used_count=int:" in override else None


def speed(argv: list[str], prompt: str) -> tuple[float, float, int]:
    """(tokens/s, acceptance, K) of this configuration on this prompt.

    Threads help. Fewer active MoE experts read fewer weights: the experts hold 80% of
    them, 8 experts of which DEFAULT_EXPERTS are used by default. A draft's acceptance falls
    with K, more slowly on code (a prompt starting "def ") than on prose, so the best K
    differs by content type; an n-gram lookup accepts 30% everywhere.
    """
    threads = int(flag(argv, "--threads", "1"))
    base = 40.0 * threads**0.8 * float(os.environ.get("FAKE_LLAMA_SPEED") or 1)
    experts = active_experts(argv)
    if experts is not None:
        base *= (0.2 + 0.1 * DEFAULT_EXPERTS) / (0.2 + 0.1 * experts)
    spec_type = flag(argv, "--spec-type", "none")
    if spec_type == "none":
        return base, 0.0, 0
    k = int(flag(argv, "--spec-draft-n-max", None) or flag(argv, "--spec-ngram-simple-size-m", None) or "4")
    if spec_type != "draft-simple":
        acceptance = 0.3
    elif prompt.startswith("def "):
        acceptance = max(0.05, 0.9 - 0.03 * k)
    else:
        acceptance = max(0.05, 0.75 - 0.1 * k)
    return base * (1 + acceptance * k) / (1 + 0.2 * k), acceptance, k


def tokens_for(prompt: str, n: int, temperature: float, seed: int, experts: int | None = None) -> list[int]:
    """Deterministic tokens; above temperature 0 every fifth one depends on the seed, and
    each expert fewer than the default changes one token in eight."""
    h = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big")
    tokens = [(h + 7 * i) % 1000 for i in range(n)]
    if temperature > 0:
        tokens = [t if i % 5 else (t + seed + int(temperature * 100)) % 1000 for i, t in enumerate(tokens)]
    if experts is not None:
        tokens = [(t + 500) % 1000 if i % 8 < DEFAULT_EXPERTS - experts else t for i, t in enumerate(tokens)]
    return tokens


def log(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str]) -> int:
    if "--version" in argv:
        commit = os.environ.get("FAKE_LLAMA_COMMIT", PINNED_COMMIT)
        print(f"version: 0.5.0-dev (build 1, commit {commit})", file=sys.stderr)
        print("built with cc (fake) for x86_64-linux-gnu", file=sys.stderr)
        return 0
    if "--help" in argv:
        usage = os.environ.get("FAKE_LLAMA_HELP")
        print(Path(usage).read_text() if usage else "")
        return 0
    fault = fault_for(argv)
    mask = flag(argv, "--cpu-mask")
    if mask and flag(argv, "--cpu-strict") == "1" and fault != "unpinned":
        bits = int(mask, 16)
        try:
            os.sched_setaffinity(0, {cpu for cpu in range(bits.bit_length()) if bits >> cpu & 1})
        except OSError:  # a CPU this host does not have: llama.cpp warns and runs on
            pass
    log(f"build: 1 ({os.environ.get('FAKE_LLAMA_COMMIT', PINNED_COMMIT)}) with cc (fake)")
    log(f"llama_model_load: loading model from {flag(argv, '--model')}")
    if fault == "launch":
        log("error: invalid argument: --fake-bad-flag")
        return 1
    if fault == "exit137":
        log("llama_model_load: loading tensors")
        return 137
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "hang":
        while True:
            time.sleep(60)
    host, port = flag(argv, "--host", "127.0.0.1"), int(flag(argv, "--port", "8080"))
    if fault == "nodraft":
        log("common_speculative_are_compatible: the target and draft vocabs are not compatible")
        log("srv load_model: failed to initialize speculative decoding context")
    delay = float(os.environ.get("FAKE_LLAMA_DELAY_S") or 0)
    tasks = iter(range(10**9))
    requests = iter(range(10**9))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self.answer(200, {"status": "ok"})
            else:
                self.answer(404, {"error": "not found"})

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            log(f"slot launch_slot_: id  0 | task {next(tasks)} | processing task")
            if fault == "crash_mid_run":
                os.kill(os.getpid(), signal.SIGSEGV)
            if fault == "http500":
                self.answer(500, {"error": {"code": 500, "message": "fake internal error"}})
                return
            if fault == "http200error":
                self.answer(200, {"error": {"code": 500, "message": "fake error in a 200"}})
                return
            time.sleep(delay)
            n, prompt = int(request.get("n_predict", 16)), request.get("prompt", "")
            tps, acceptance, k = speed(argv, prompt)
            if fault == "nodraft":
                k = 0
            tokens = tokens_for(
                prompt,
                n,
                float(request.get("temperature", 0.0)),
                int(request.get("seed", 0)),
                active_experts(argv),
            )
            task = next(requests)
            jitter = float(os.environ.get("FAKE_LLAMA_JITTER") or 0)  # a noisy machine: +-jitter per request
            rate, accept = tps, acceptance
            short_k = os.environ.get("FAKE_LLAMA_SHORT_K")
            if k and short_k and short_k in request.get("prompt", ""):
                accept = max(0.05, 0.6 - 0.15 * k)
                rate = tps / (1 + acceptance * k) * (1 + accept * k)
            rate = rate * (1 + jitter * (2 * ((task * 2654435761) % 1000) / 999 - 1))
            decode_ms = 1000.0 * n / rate
            time.sleep(decode_ms / 1000.0)  # honest timings: the wall clock holds the decode time it reports
            claimed = decode_ms / 10 if fault == "liar" else decode_ms
            timings = {
                "prompt_n": 8,
                "prompt_ms": 4.0 + 1000 * delay,
                "predicted_n": n,
                "predicted_ms": claimed,
                "predicted_per_second": 1000.0 * n / claimed,
            }
            if k:
                drafted = n * k // 2
                timings.update(draft_n=drafted, draft_n_accepted=round(drafted * accept))
            self.answer(
                200,
                {
                    "content": " ".join(f"w{t}" for t in tokens),
                    "tokens": tokens,
                    "stop_type": "limit",
                    "timings": timings,
                },
            )

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as err:
        log(f"start: couldn't bind HTTP server socket, hostname: {host}, port: {port}: {err}")
        return 1
    server.daemon_threads = True
    launches = os.environ.get("FAKE_LLAMA_LAUNCHES")
    if launches:
        with open(launches, "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "port": port, "argv": argv}) + "\n")
    log(f"main: server is listening on http://{host}:{port} - starting the main loop")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
