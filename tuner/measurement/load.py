"""Several users at once: a bounded, closed-loop load on one llama-server, per request and per level.

Why: an operator's server answers several users at once with continuous batching, and decode on a CPU
is bound by memory bandwidth, so a batch of users' tokens costs little more than one user's. What one
user gets (``measure.run_workload``) says nothing of what N users get together. A level of N users is N
client threads on 127.0.0.1, each sending its share of the suite's prompts one after another (closed
loop: a client's next request leaves when its previous answer arrives), every request generating the
full ``n_predict`` tokens (``ignore_eos``) so the clients stay in step and the level does not end on the
tail of one long answer. Per request: time to first token, time per output token and tokens; per
level: the aggregate tokens/s, all generated tokens over the level's wall time.

The server's own timings are its truth where they exist: ``predicted_ms`` is the request's generation
time, so time per output token is ``predicted_ms / predicted_n`` (llama.cpp's ``predicted_per_token_ms``;
with several slots each request's ``predicted_per_second`` is its slot's rate, not the server's).
Without streaming, the first token is known to the client at ``wall_ms - predicted_ms``: queueing for a
slot, the HTTP round trip and the prompt (``prompt_ms``, the server's part of it).
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable

from tuner.measurement.server_process import Completion, LlamaServer
from tuner.measurement.workload import Prompt

# What a study can optimise or bound at a concurrency level; latencies are in milliseconds.
LOAD_METRICS = {
    "aggregate_tokens_per_second": "maximize",
    "p50_ttft_ms": "minimize",
    "p95_ttft_ms": "minimize",
    "p50_tpot_ms": "minimize",
    "p95_tpot_ms": "minimize",
}
LATENCY_METRICS = tuple(m for m in LOAD_METRICS if m.endswith("_ms"))
_LEVEL_NAME = re.compile(r"^(?P<metric>[a-z0-9_]+?)(?:_c(?P<users>\d+))?$")


def metric_name(metric: str, users: int) -> str:
    """A load metric at one level, as stored and shown: ``p95_ttft_ms_c4``."""
    return f"{metric}_c{users}"


def split_metric_name(name: str) -> tuple[str, int | None] | None:
    """(metric, users or None) for a load metric name with or without its level; None for any other name."""
    match = _LEVEL_NAME.match(name)
    if not match or match["metric"] not in LOAD_METRICS:
        return None
    return match["metric"], int(match["users"]) if match["users"] else None


@dataclass(frozen=True)
class LoadRequest:
    """One request of a level, as its client and the server saw it."""

    users: int
    client: int
    prompt_id: str
    predicted_n: int
    predicted_ms: float
    prompt_n: int
    prompt_ms: float
    wall_ms: float
    start_ms: float  # when it left, from the level's start
    draft_n: int = 0
    draft_n_accepted: int = 0

    @property
    def ttft_ms(self) -> float:
        """Until the first token: the wall time less the server's generation time (never below the prompt's)."""
        return max(self.prompt_ms, self.wall_ms - self.predicted_ms)

    @property
    def tpot_ms(self) -> float:
        return self.predicted_ms / self.predicted_n if self.predicted_n else 0.0


@dataclass(frozen=True)
class Level:
    """One concurrency level: its requests and its wall time (first request sent to last answer)."""

    users: int
    requests: tuple[LoadRequest, ...]
    wall_s: float

    @property
    def tokens(self) -> int:
        return sum(r.predicted_n for r in self.requests)

    @property
    def aggregate_tokens_per_second(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> dict:
        """The level as a trial record stores it: figures by metric name, and every request."""
        ttft = [r.ttft_ms for r in self.requests]
        tpot = [r.tpot_ms for r in self.requests]
        return {
            "users": self.users,
            "requests": len(self.requests),
            "tokens": self.tokens,
            "wall_s": self.wall_s,
            "aggregate_tokens_per_second": self.aggregate_tokens_per_second,
            "p50_ttft_ms": percentile(ttft, 50),
            "p95_ttft_ms": percentile(ttft, 95),
            "p50_tpot_ms": percentile(tpot, 50),
            "p95_tpot_ms": percentile(tpot, 95),
            "samples": [{**asdict(r), "ttft_ms": r.ttft_ms, "tpot_ms": r.tpot_ms} for r in self.requests],
        }


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, linear between the two nearest ranks (numpy's default), 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def plan(prompts: tuple[Prompt, ...], users: int, rounds: int = 1) -> list[list[Prompt]]:
    """Each client's prompts: the suite dealt round-robin, every client the same number of requests
    (at least ``rounds``), so all users stay busy until the level ends."""
    per_client = max(rounds, math.ceil(len(prompts) / users))
    return [
        [prompts[(client + users * i) % len(prompts)] for i in range(per_client)] for client in range(users)
    ]


def run_level(
    server: LlamaServer,
    prompts: tuple[Prompt, ...],
    users: int,
    n_predict: int,
    temperature: float,
    seed: int,
    rounds: int = 1,
) -> Level:
    """``users`` clients at once over ``prompts`` (see ``plan``); the first failure stops the others
    after their current request and is raised here."""
    work = plan(prompts, users, rounds)
    done: list[LoadRequest] = []
    failures: list[BaseException] = []
    stop = threading.Event()
    started = time.monotonic()

    def client(index: int) -> None:
        for prompt in work[index]:
            if stop.is_set():
                return
            sent = time.monotonic()
            try:
                completion = _send(server, prompt, n_predict, temperature, seed)
            except BaseException as err:  # noqa: BLE001 - handed to the main thread, which raises it
                failures.append(err)
                stop.set()
                return
            done.append(_load_request(users, index, prompt, completion, 1000.0 * (sent - started)))

    _run_clients(users, client)
    if failures:
        raise failures[0]
    return Level(users, tuple(sorted(done, key=lambda r: r.start_ms)), time.monotonic() - started)


def _send(server: LlamaServer, prompt: Prompt, n_predict: int, temperature: float, seed: int) -> Completion:
    """One request that generates all ``n_predict`` tokens (``ignore_eos``), so the clients stay in step."""
    return (  # a conversation's users send its first request
        server.chat(prompt.conversation(), n_predict, temperature, seed, extra={"ignore_eos": True})
        if prompt.chat
        else server.complete(prompt.text, n_predict, temperature, seed, extra={"ignore_eos": True})
    )


def _load_request(
    users: int, client: int, prompt: Prompt, completion: Completion, start_ms: float
) -> LoadRequest:
    """The request as its client and the server saw it: the server's timings, the client's clock."""
    return LoadRequest(
        users,
        client,
        prompt.id,
        completion.predicted_n,
        completion.predicted_ms,
        completion.prompt_n,
        completion.prompt_ms,
        completion.wall_ms,
        start_ms,
        completion.draft_n,
        completion.draft_n_accepted,
    )


def _run_clients(users: int, client: Callable[[int], None]) -> None:
    """One thread per user, all started before any is awaited, so the level's users are at once."""
    threads = [
        threading.Thread(target=client, args=(i,), name=f"load-{users}-{i}", daemon=True)
        for i in range(users)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def run_levels(
    server: LlamaServer,
    prompts: tuple[Prompt, ...],
    levels: tuple[int, ...],
    n_predict: int,
    temperature: float,
    seed: int,
) -> list[Level]:
    """Every level in turn on one server, fewest users first."""
    return [run_level(server, prompts, users, n_predict, temperature, seed) for users in sorted(levels)]
