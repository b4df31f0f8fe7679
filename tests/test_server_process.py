"""``LlamaServer`` (one pinned llama-server process) against real llama-server processes, plus stand-in
executables for faults a real server cannot be made to show on demand (OOM kill, a crash before ready)."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from pathlib import Path

import pytest
from fake_llama_server import alive, port_is_free, wait_for

from tuner.machine.llama_build import binary
from tuner.measurement.failures import FailureReason, TrialFailure
from tuner.measurement.server_process import LlamaServer, classify_exit, free_port


def server_argv(model: Path, *extra: str) -> list[str]:
    return [
        str(binary("llama-server")),
        "-m",
        str(model),
        "-t",
        "2",
        "-c",
        "1024",
        "-np",
        "1",
        "--no-webui",
        *extra,
    ]


def draft_flags(draft: Path) -> list[str]:
    """In this llama.cpp, ``-md`` alone only loads the draft: ``--spec-type`` turns drafting on."""
    return ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", "4"]


def stand_in(tmp_path: Path, body: str) -> list[str]:
    """A fake server: a shell script that does ``body`` whatever its arguments."""
    script = tmp_path / "fake-server.sh"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return [str(script)]


@pytest.fixture
def target(synthetic_models) -> Path:
    return synthetic_models.path("target")


@pytest.fixture
def small(synthetic_models) -> Path:
    """The smallest valid member (1 layer, under 1 MB): enough for tests of the plumbing."""
    return synthetic_models.path("draft-small")


# --- real llama-server --------------------------------------------------------------


def test_ready_completion_deterministic_greedy_and_clean_stop(small, tmp_path):
    port = free_port()
    server = LlamaServer(server_argv(small), port, tmp_path / "server.log", ready_timeout_s=60)
    with server:
        pid = server.pid
        first = server.complete("def read_config(path):\n", n_predict=24, temperature=0.0, seed=1)
        second = server.complete("def read_config(path):\n", n_predict=24, temperature=0.0, seed=2)
        with pytest.raises(TrialFailure) as too_long:  # an HTTP error from a live server
            server.complete("import os\n" * 2000, n_predict=4, temperature=0.0, seed=1)
    assert first.predicted_n > 0 and len(first.tokens) == first.predicted_n
    assert first.predicted_ms > 0 and first.predicted_per_second > 0
    assert first.prompt_n > 0 and first.text
    assert first.stop_type in ("limit", "eos")
    assert (first.draft_n, first.draft_n_accepted) == (0, 0)
    assert second.tokens == first.tokens and second.text == first.text  # greedy ignores the seed
    # issue 21: llama-server's HTTP 400 for a prompt longer than the context is the study file's to fix
    assert too_long.value.reason is FailureReason.CONTEXT_EXCEEDED
    assert re.fullmatch(
        r"a prompt of \d{4,} tokens does not fit ctx_size 1024; shorten it or raise "
        r"measurement.ctx_size \(`tuner run STUDY --check` names the prompt\)",
        too_long.value.detail,
    )
    assert not alive(pid)
    assert port_is_free(port)
    assert "listening on http" in (tmp_path / "server.log").read_text()
    server.stop()  # idempotent


def test_draft_model_drafts(synthetic_models, target, tmp_path):
    argv = server_argv(target, *draft_flags(synthetic_models.path("draft-small")))
    with LlamaServer(argv, free_port(), tmp_path / "server.log", ready_timeout_s=60) as server:
        completion = server.complete("def flatten(items):\n", n_predict=16, temperature=0.0, seed=1)
        assert server.speculation_log_problem() is None
    assert completion.draft_n > 0
    assert 0 < completion.draft_n_accepted <= completion.draft_n  # the family's drafts do predict the target


def test_incompatible_draft_serves_without_drafting_and_says_why(synthetic_models, target, tmp_path):
    argv = server_argv(target, *draft_flags(synthetic_models.path("incompatible-draft")))
    with LlamaServer(argv, free_port(), tmp_path / "server.log", ready_timeout_s=60) as server:
        completion = server.complete("def flatten(items):\n", n_predict=8, temperature=0.0, seed=1)
        problem = server.speculation_log_problem()
    assert completion.draft_n == 0 and completion.predicted_n > 0
    assert problem and "the target and draft vocabs are not compatible" in problem


def test_unknown_flag_is_launch_failed(small, tmp_path):
    argv = server_argv(small, "--no-such-flag")
    with pytest.raises(TrialFailure) as err:
        with LlamaServer(argv, free_port(), tmp_path / "server.log", ready_timeout_s=60):
            pass
    assert err.value.reason is FailureReason.LAUNCH_FAILED
    assert "--no-such-flag" in err.value.log_tail


def test_truncated_gguf_is_model_load_failed(small, tmp_path):
    data = small.read_bytes()
    broken = tmp_path / "truncated.gguf"
    broken.write_bytes(data[: len(data) // 2])
    with pytest.raises(TrialFailure) as err:
        with LlamaServer(server_argv(broken), free_port(), tmp_path / "server.log", ready_timeout_s=60):
            pass
    assert err.value.reason is FailureReason.MODEL_LOAD_FAILED
    assert "load" in err.value.log_tail


def test_port_taken_between_free_port_and_bind_retries_on_another(small, tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        with LlamaServer(server_argv(small), taken, tmp_path / "server.log", ready_timeout_s=60) as server:
            assert server.port != taken
            assert server.complete("import os\n", n_predict=4, temperature=0.0, seed=1).predicted_n > 0
    log = (tmp_path / "server.log").read_text()
    assert "couldn't bind HTTP server socket" in log and "listening on http" in log


def test_stopped_server_times_out_a_request_and_is_still_reaped(small, tmp_path):
    server = LlamaServer(
        server_argv(small), free_port(), tmp_path / "server.log", ready_timeout_s=60, request_timeout_s=1.0
    )
    with pytest.raises(TrialFailure) as err:
        with server:
            os.kill(server.pid, signal.SIGSTOP)  # the kernel still accepts the connection: the request hangs
            server.complete("import os\n", n_predict=64, temperature=0.0, seed=1)
    assert err.value.reason is FailureReason.TIMEOUT
    assert not alive(server.pid)


def test_ctrl_c_inside_the_block_still_stops_the_server(small, tmp_path):
    server = LlamaServer(server_argv(small), free_port(), tmp_path / "server.log", ready_timeout_s=60)
    with pytest.raises(KeyboardInterrupt):
        with server:
            raise KeyboardInterrupt
    assert not alive(server.pid)


def test_server_killed_mid_run_is_reported_not_unreachable(small, tmp_path):
    with pytest.raises(TrialFailure) as err:
        with LlamaServer(
            server_argv(small), free_port(), tmp_path / "server.log", ready_timeout_s=60
        ) as server:
            os.kill(server.pid, signal.SIGSEGV)
            server.complete("import os\n", n_predict=4, temperature=0.0, seed=1)
    assert err.value.reason is FailureReason.CRASHED
    assert "SIGSEGV" in err.value.detail


# --- stand-in executables (fault injection) -------------------------------------------


def test_exit_137_before_ready_is_out_of_memory(tmp_path):
    argv = stand_in(tmp_path, "echo 'llama_model_load: loading tensors'\nexit 137")
    with pytest.raises(TrialFailure) as err:
        with LlamaServer(argv, free_port(), tmp_path / "server.log", ready_timeout_s=10):
            pass
    assert err.value.reason is FailureReason.OUT_OF_MEMORY
    assert "exit code 137" in err.value.detail
    assert "loading tensors" in err.value.log_tail


def test_signal_before_ready_is_crashed(tmp_path):
    argv = stand_in(tmp_path, "echo starting\nkill -SEGV $$")
    with pytest.raises(TrialFailure) as err:
        with LlamaServer(argv, free_port(), tmp_path / "server.log", ready_timeout_s=10):
            pass
    assert err.value.reason is FailureReason.CRASHED
    assert "SIGSEGV" in err.value.detail


def test_never_ready_times_out_and_the_whole_process_group_is_stopped(tmp_path):
    child_pid_file = tmp_path / "child.pid"
    argv = stand_in(tmp_path, f"sleep 300 &\necho $! > {child_pid_file}\nwait")
    server = LlamaServer(argv, free_port(), tmp_path / "server.log", ready_timeout_s=1.0)
    with pytest.raises(TrialFailure) as err:
        with server:
            pass
    assert err.value.reason is FailureReason.TIMEOUT
    assert "not ready after 1 s" in err.value.detail  # the configured wait, not the default
    child = int(child_pid_file.read_text())
    wait_for(lambda: not alive(child), 5, "init to reap the orphaned child")
    assert not alive(server.pid)


def test_ignoring_sigterm_gets_sigkill_after_the_grace(tmp_path):
    argv = stand_in(tmp_path, "trap '' TERM\necho trapped\nwhile :; do sleep 0.1; done")
    server = LlamaServer(argv, free_port(), tmp_path / "server.log", ready_timeout_s=0.5, stop_grace_s=0.5)
    started = time.monotonic()
    with pytest.raises(TrialFailure):
        with server:
            pass
    assert (
        "trapped" in (tmp_path / "server.log").read_text()
    )  # SIGTERM came after the trap: only SIGKILL ends it
    assert not alive(server.pid)
    assert time.monotonic() - started >= 0.5 + 0.5  # a lower bound: a busy machine only makes it longer


def test_second_ctrl_c_while_stopping_kills_at_once_and_still_reaps(tmp_path):
    argv = stand_in(tmp_path, "trap '' TERM\nwhile :; do sleep 0.1; done")
    grace_s = 300.0  # only the "Ctrl-C" can end the wait for the SIGTERM that is ignored
    server = LlamaServer(
        argv, free_port(), tmp_path / "server.log", ready_timeout_s=0.3, stop_grace_s=grace_s
    )

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    started = time.monotonic()
    # not ready after 0.3 s: stop() sends SIGTERM (ignored) and waits; the "Ctrl-C" comes at 1 s
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            with server:
                pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not alive(server.pid)
    assert time.monotonic() - started < grace_s / 2


def test_missing_executable_is_launch_failed(tmp_path):
    with pytest.raises(TrialFailure) as err:
        with LlamaServer([str(tmp_path / "nope")], free_port(), tmp_path / "server.log"):
            pass
    assert err.value.reason is FailureReason.LAUNCH_FAILED


@pytest.mark.parametrize(
    "returncode, log, started, reason",
    [
        (137, "", False, FailureReason.OUT_OF_MEMORY),
        (-signal.SIGKILL, "", True, FailureReason.OUT_OF_MEMORY),
        (
            1,
            "ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 9 GiB",
            False,
            FailureReason.OUT_OF_MEMORY,
        ),
        (
            1,
            "llama_model_load: error loading model: tensor data is not within the file bounds",
            False,
            FailureReason.MODEL_LOAD_FAILED,
        ),
        (1, "gguf_init_from_file_impl: failed to read magic", False, FailureReason.MODEL_LOAD_FAILED),
        (1, "error: invalid argument: --bogus", False, FailureReason.LAUNCH_FAILED),
        (-signal.SIGSEGV, "", False, FailureReason.CRASHED),
        (-signal.SIGABRT, "GGML_ASSERT failed", True, FailureReason.CRASHED),
        (1, "", True, FailureReason.CRASHED),
    ],
)
def test_classify_exit(returncode, log, started, reason):
    assert classify_exit(returncode, log, started) is reason


def test_sigkill_is_out_of_memory_only_if_the_kernel_may_have_sent_it():
    assert classify_exit(-signal.SIGKILL, "", started=True, oom_killed=True) is FailureReason.OUT_OF_MEMORY
    assert classify_exit(-signal.SIGKILL, "", started=True, oom_killed=False) is FailureReason.CRASHED
