"""Run one llama-server for one trial: start it, wait until ready, ask, always stop it.

A trial owns exactly one process, launched from an argv list in its own process group
(``start_new_session``), its output in a log file. Whatever goes wrong is classified
into a ``FailureReason`` with the log tail as evidence, and the whole group is stopped
and reaped on every exit path, Ctrl-C included; if the tuner itself is killed, the
kernel kills the server too (``PR_SET_PDEATHSIG``): a server left behind skews every
later measurement.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tuner.measurement.failures import FailureReason, TrialFailure

STOP_GRACE_S = 5.0
HEALTH_POLL_S = 0.02  # a launch is ~0.1 s on small models: a coarse poll would add half of it
DEATH_GRACE_S = 2.0  # a crash resets the connection a moment before the exit is visible
LOG_TAIL_BYTES = 64 * 1024

# Log lines (lower case) that explain an exit before the server was ready.
ALLOCATION_ERRORS = ("failed to allocate", "cannot allocate", "std::bad_alloc", "out of memory")
MODEL_LOAD_ERRORS = (
    "failed to load model",
    "error loading model",
    "gguf_init",
    "exiting due to model loading error",
)
PORT_TAKEN = ("address already in use", "couldn't bind http server socket")
# What llama.cpp logs when it was asked to speculate and silently serves without it.
SPECULATION_OFF = (
    "the target and draft vocabs are not compatible",
    "failed to initialize speculative decoding context",
    "speculative decoding not supported by this context",
    "draft model vocab type must match",
)


# At trace verbosity llama-server logs, after every request, each speculative implementation's
# running totals (common_speculative_print_stats): the only per-source figure it reports.
STATS_VERBOSITY = ("--log-verbosity", "4")
SOURCE_STATS = re.compile(r"statistics\s+(\S+): .*?#gen tokens =\s*(\d+), #acc tokens =\s*(\d+)")
SOURCE_STATS_WAIT_S = 2.0  # llama.cpp's log is written by its own thread, a little after the answer


def source_blocks(log_text: str) -> list[dict[str, tuple[int, int]]]:
    """Per finished request, each speculative implementation's running (drafted, accepted) totals.

    llama-server prints one statistics line per implementation at the end of every request, in
    the same order each time; a block ends when a type repeats."""
    blocks: list[dict[str, tuple[int, int]]] = []
    current: dict[str, tuple[int, int]] = {}
    for name, drafted, accepted in SOURCE_STATS.findall(log_text):
        if name in current:
            blocks.append(current)
            current = {}
        current[name] = (int(drafted), int(accepted))
    return blocks + ([current] if current else [])


PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def _die_with_parent(parent: int) -> None:
    """In the child before exec: have the kernel SIGKILL it when the tuner dies, even by
    SIGKILL, so no server outlives a killed worker. The kernel watches the launching
    thread; the tuner launches from its main thread."""
    assert _LIBC is not None, "the hook is installed only where libc was loaded (Linux)"
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the tuner died before the request took effect
        os._exit(1)


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed so far (None if unknown)."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now.

    The port is released before llama-server binds it, so another process may take it
    in between; ``LlamaServer`` retries once on a new port when its log says the
    address is in use.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Completion:
    """One /completion answer; timings are llama.cpp's own, never wall clock."""

    text: str
    tokens: tuple[int, ...]
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float
    prompt_n: int
    prompt_ms: float
    draft_n: int  # 0 when the server did not draft (the field is then absent)
    draft_n_accepted: int
    stop_type: str  # "eos", "limit", "word" or "none"
    wall_ms: float = 0.0  # the request as the client saw it: a check on llama.cpp's own timings
    cached_n: int = 0  # prompt tokens the server took from its prompt cache

    @classmethod
    def from_response(cls, body: dict, wall_ms: float = 0.0) -> Completion:
        """A completion, or BAD_RESPONSE for a body that is an error or lacks its timings."""
        if not isinstance(body, dict) or "error" in body or not isinstance(body.get("timings"), dict):
            raise TrialFailure(
                FailureReason.BAD_RESPONSE,
                f"/completion answered HTTP 200 with no result: {json.dumps(body)[:300]}",
            )
        return cls._timed(
            body["content"],
            tuple(body.get("tokens") or ()),
            body["timings"],
            body.get("stop_type", "none"),
            wall_ms,
            int(body.get("tokens_cached") or 0),
        )

    @classmethod
    def from_chat(cls, body: dict, wall_ms: float = 0.0) -> Completion:
        """A /v1/chat/completions answer. The OpenAI API returns no token ids: ``tokens`` are the reply's
        UTF-8 bytes, which agreement compares as it compares tokens (the same text, the same bytes)."""
        choices = body.get("choices") if isinstance(body, dict) else None
        timings = body.get("timings") if isinstance(body, dict) else None
        message = choices[0].get("message") if isinstance(choices, list) and choices else None
        if not isinstance(timings, dict) or not isinstance(message, dict):
            raise TrialFailure(
                FailureReason.BAD_RESPONSE,
                f"/v1/chat/completions answered HTTP 200 with no result: {json.dumps(body)[:300]}",
            )
        assert isinstance(choices, list), "the message was read from the first choice"
        text = message.get("content") or ""
        usage = body.get("usage") or {}
        return cls._timed(
            text,
            tuple(text.encode()),
            timings,
            {"length": "limit", "stop": "eos"}.get(choices[0].get("finish_reason"), "none"),
            wall_ms,
            int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
        )

    @classmethod
    def _timed(
        cls, text: str, tokens: tuple, timings: dict, stop_type: str, wall_ms: float, cached_n: int
    ) -> Completion:
        """An answer from llama.cpp's ``timings`` object, which both endpoints return alike."""
        return cls(
            text=text,
            tokens=tokens,
            predicted_n=int(timings["predicted_n"]),
            predicted_ms=float(timings["predicted_ms"]),
            predicted_per_second=float(timings["predicted_per_second"]),
            prompt_n=int(timings["prompt_n"]),
            prompt_ms=float(timings["prompt_ms"]),
            draft_n=int(timings.get("draft_n", 0)),
            draft_n_accepted=int(timings.get("draft_n_accepted", 0)),
            stop_type=stop_type,
            wall_ms=wall_ms,
            cached_n=cached_n,
        )


def classify_exit(
    returncode: int, log_text: str, started: bool, oom_killed: bool | None = None
) -> FailureReason:
    """Why a llama.cpp process ended on its own; ``started`` means it had been serving.

    Exit 137 / SIGKILL is what the kernel's OOM killer leaves; allocation errors in
    the log say the same in llama.cpp's words. ``oom_killed`` is False when the kernel's
    OOM-kill count did not move meanwhile: that SIGKILL came from someone else, a crash
    (not a permanent failure of the configuration). Before serving, a model error means
    a bad GGUF and anything else a bad binary or flag; once serving, any exit is a crash.
    """
    text = log_text.lower()
    if returncode == -signal.SIGKILL and oom_killed is False:
        return FailureReason.CRASHED
    if returncode in (137, -signal.SIGKILL) or any(p in text for p in ALLOCATION_ERRORS):
        return FailureReason.OUT_OF_MEMORY
    if started or returncode < 0:
        return FailureReason.CRASHED
    if any(p in text for p in MODEL_LOAD_ERRORS):
        return FailureReason.MODEL_LOAD_FAILED
    return FailureReason.LAUNCH_FAILED


def context_exceeded(status: int, body: str) -> str | None:
    """The detail of llama-server's refusal of a prompt longer than its context (HTTP 400,
    ``exceed_context_size_error``), or None for any other answer."""
    if (
        status != 400
        or "exceed_context_size_error" not in body
        and "exceeds the available context size" not in body
    ):
        return None
    try:
        error = json.loads(body).get("error", {})
        tokens, ctx = int(error["n_prompt_tokens"]), int(error["n_ctx"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"a prompt does not fit the context (llama-server: {body[:200]}); shorten it or raise measurement.ctx_size"
    return (
        f"a prompt of {tokens} tokens does not fit ctx_size {ctx}; shorten it or raise measurement.ctx_size "
        "(`tuner run STUDY --check` names the prompt)"
    )


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM unwinds like Ctrl-C: running servers are stopped and the trial recorded, not orphaned."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_process_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group, SIGKILL it after ``grace_s``, and reap the leader.

    A leader already reaped is left alone: its pid may belong to someone else by now.
    """
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        os.killpg(proc.pid, signal.SIGCONT)  # a stopped (SIGSTOP) process handles SIGTERM only once resumed
    except ProcessLookupError:
        pass  # the whole group is already gone; only the reaping is left
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
    except BaseException:  # a second Ctrl-C while waiting: no more patience, but still reap
        _kill_group(proc)
        raise


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def read_log_tail(path: Path, count: int) -> str:
    """The last ``count`` lines of a log file ("" if there is none yet)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
            data = fh.read()
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-count:])


class LlamaServer:
    """A llama-server process for one trial, as a context manager.

    Lifecycle: ``__enter__`` launches ``argv + --host/--port`` (``argv`` is the whole
    command, launcher prefix and binary included, without ``--host``/``--port``) and
    polls ``GET /health`` until it answers 200, raising a classified ``TrialFailure``
    if the process exits or the wait times out; ``complete`` sends requests;
    ``__exit__`` (or ``stop``) ends the process group on every path: SIGTERM, then
    SIGKILL after ``stop_grace_s`` (tests of the stop path pass a short one). If
    ``__enter__`` fails, it has already stopped the process.
    """

    def __init__(
        self,
        argv: list[str],
        port: int,
        log_path: Path,
        ready_timeout_s: float = 120.0,
        request_timeout_s: float = 120.0,
        host: str = "127.0.0.1",
        stop_grace_s: float = STOP_GRACE_S,
    ):
        self.argv = list(argv)
        self.port = port
        self.log_path = Path(log_path)
        self.ready_timeout_s = ready_timeout_s
        self.request_timeout_s = request_timeout_s
        self.host = host
        self.stop_grace_s = stop_grace_s
        self._proc: subprocess.Popen | None = None
        # Never through an HTTP proxy from the environment: the server is local.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._log_offset = 0  # where this launch attempt's output starts in the log
        self._oom_kills_at_launch: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def __enter__(self) -> LlamaServer:
        try:
            self._launch(append=False)
            try:
                self._wait_ready()
            except TrialFailure:
                if not self._port_taken():
                    raise
                self.stop()  # lost the race for the port (see free_port): once more on another
                self.port = free_port(self.host)
                self._launch(append=True)
                self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _launch(self, append: bool) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab" if append else "wb") as log:
            self._log_offset = log.tell()
            self._oom_kills_at_launch = oom_kills()
            try:
                self._proc = subprocess.Popen(
                    [*self.argv, "--host", self.host, "--port", str(self.port), *STATS_VERBOSITY],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=functools.partial(_die_with_parent, os.getpid()) if _LIBC else None,
                )
            except OSError as err:
                raise TrialFailure(
                    FailureReason.LAUNCH_FAILED, f"cannot run {self.argv[0]}: {err.strerror}"
                ) from err

    def _oom_killed(self) -> bool | None:
        now = oom_kills()
        return None if now is None or self._oom_kills_at_launch is None else now > self._oom_kills_at_launch

    def _attempt_log(self) -> str:
        with open(self.log_path, "rb") as fh:
            fh.seek(self._log_offset)
            return fh.read().decode("utf-8", errors="replace")

    def _port_taken(self) -> bool:
        text = self._attempt_log().lower()
        return any(p in text for p in PORT_TAKEN)

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            returncode = self._proc.poll()
            if returncode is not None:
                reason = classify_exit(
                    returncode, self._attempt_log(), started=False, oom_killed=self._oom_killed()
                )
                detail = f"llama-server ended before ready ({describe_exit(returncode)})"
                raise TrialFailure(reason, detail, self.log_tail())
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TrialFailure(
                    FailureReason.TIMEOUT,
                    f"llama-server not ready after {self.ready_timeout_s:g} s",
                    self.log_tail(),
                )
            if self._healthy(min(2.0, remaining)):
                return
            time.sleep(HEALTH_POLL_S)

    def _healthy(self, timeout_s: float) -> bool:
        """True once /health answers 200 (it answers 503 while the model loads)."""
        try:
            with self._opener.open(f"{self.url}/health", timeout=timeout_s) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def complete(
        self, prompt: str, n_predict: int, temperature: float, seed: int, extra: dict | None = None
    ) -> Completion:
        """One /completion request, prompt cache off so every request does the same work; ``extra``:
        more request fields (the load generator's ``ignore_eos``). Safe from several threads at once."""
        body = {
            "prompt": prompt,
            "n_predict": n_predict,
            "temperature": temperature,
            "seed": seed,
            "cache_prompt": False,
            "return_tokens": True,
            **(extra or {}),
        }
        return self._post("/completion", body, Completion.from_response)

    def chat(
        self,
        messages: list[dict[str, str]],
        n_predict: int,
        temperature: float,
        seed: int,
        extra: dict | None = None,
    ) -> Completion:
        """One /v1/chat/completions request through the served chat template, prompt cache on as a
        server in production keeps it (a conversation's next turn reuses what the last one computed)."""
        body = {
            "messages": messages,
            "max_tokens": n_predict,
            "temperature": temperature,
            "seed": seed,
            "cache_prompt": True,
            "stream": False,
            **(extra or {}),
        }
        return self._post("/v1/chat/completions", body, Completion.from_chat)

    def _post(self, path: str, body: dict, parse) -> Completion:
        """POST one request; every way it can fail is a classified TrialFailure."""
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        started = time.monotonic()
        try:
            with self._opener.open(request, timeout=self.request_timeout_s) as resp:
                answer = json.load(resp)
            return parse(answer, wall_ms=1000.0 * (time.monotonic() - started))
        except urllib.error.HTTPError as err:
            self._raise_if_died(grace_s=0)
            detail = err.read().decode("utf-8", errors="replace")[:500]
            exceeded = context_exceeded(err.code, detail)
            if exceeded is not None:
                raise TrialFailure(FailureReason.CONTEXT_EXCEEDED, exceeded, self.log_tail()) from err
            raise TrialFailure(
                FailureReason.SERVER_UNREACHABLE,
                f"{path} answered HTTP {err.code}: {detail}",
                self.log_tail(),
            ) from err
        except (TimeoutError, socket.timeout) as err:
            self._raise_if_died()
            raise self._timeout(path) from err
        except (urllib.error.URLError, OSError, ValueError, KeyError) as err:
            self._raise_if_died()
            if isinstance(getattr(err, "reason", None), (TimeoutError, socket.timeout)):
                raise self._timeout(path) from err
            raise TrialFailure(
                FailureReason.SERVER_UNREACHABLE, f"{path} failed: {err}", self.log_tail()
            ) from err

    def _timeout(self, path: str = "/completion") -> TrialFailure:
        return TrialFailure(
            FailureReason.TIMEOUT, f"{path} not answered within {self.request_timeout_s:g} s", self.log_tail()
        )

    def _raise_if_died(self, grace_s: float = DEATH_GRACE_S) -> None:
        """After a failed request: if the server died, that is the failure to report."""
        assert self._proc is not None
        try:
            returncode = self._proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            return
        reason = classify_exit(returncode, self._attempt_log(), started=True, oom_killed=self._oom_killed())
        raise TrialFailure(
            reason, f"llama-server died during a request ({describe_exit(returncode)})", self.log_tail()
        )

    def stop(self) -> None:
        """End the process group (SIGTERM, then SIGKILL after ``stop_grace_s``) and reap it; idempotent."""
        if self._proc is not None:
            stop_process_group(self._proc, self.stop_grace_s)

    def log_tail(self, count: int = 40) -> str:
        return read_log_tail(self.log_path, count)

    def source_totals(self, requests: int) -> list[dict[str, tuple[int, int]]]:
        """Each finished request's per-source running totals, once the log holds all ``requests`` of
        them (it lags the answers); [] without speculation or when the log never catches up."""
        deadline = time.monotonic() + SOURCE_STATS_WAIT_S
        while True:
            blocks = source_blocks(self._attempt_log())
            if len(blocks) >= requests or time.monotonic() >= deadline:
                return blocks if len(blocks) == requests else []
            time.sleep(0.02)

    def speculation_log_problem(self) -> str | None:
        """The log lines saying speculation is off, to explain SPECULATION_UNAVAILABLE."""
        lines = [
            line.strip()
            for line in self._attempt_log().splitlines()
            if any(p in line.lower() for p in SPECULATION_OFF)
        ]
        return "\n".join(lines) or None
