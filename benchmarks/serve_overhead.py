"""7: what ``tuner serve`` costs: the proxy's added latency against calling the upstream directly, at 1 and at 64
concurrent streaming clients, and the classifier's accuracy on the built-in suites' held-out prompts.

The latency half measures the proxy's own overhead, so its upstream is a fake, fast one (an aiohttp app in a
process of its own) that streams a completion as llama-server does, one SSE event per token, at a set
interval: a real router's decode time would only add the same seconds to both sides. What the proxy does per
request is fixed (read, classify, forward), but what it does per second grows with the tokens streamed through
it in all, so each load names both: the clients at once and the tokens/s the upstream streams in all
(``LOADS``): 1 client at 100 tokens/s (the synthetic target's single-stream rate); 64 clients sharing
1,000 tokens/s (more than a CPU router serves 64 users at once); and 64 clients at 100 tokens/s each
(6,400 tokens/s, the proxy's ceiling, no CPU router's load). Direct and proxied rounds alternate at each
load, in one run, the clients' first requests spread evenly over one answer's time (users arrive apart); each
request's time to its last byte (and to its first) is recorded, and the added latency
is the proxied percentile less the direct one (p50, p99), with their ratio. The requests of one round share its
conditions (the clients run together), so a run holds about as many independent readings of the added p50 as it
has rounds: each round pair's own added p50 (proxied less direct, the two rounds next to each other) is reported
too, their median and range, which is the figure's spread within the run. The proxy runs in its own process as
``tuner serve`` does, writing its access lines to a file.

The accuracy half classifies each built-in suite's held-out prompts (``measurement/workload.split``: the last
third, not the tuning prompts) the way the proxy does (``output/serve_routing``: a raw prompt as a completion's
``prompt``, a conversation's messages as a chat request), against the suite's name (``chat-X`` taken as X).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import socket
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from tuner.decisions.route import request_type
from tuner.measurement.server_process import free_port
from tuner.measurement.workload import BUILTIN_SUITES, load_workload, split
from tuner.output.serve_proxy import Proxy, run_proxy
from tuner.output.serve_routing import Routing

EVENTS = 16  # tokens per streamed answer
# (clients at once, tokens/s streamed in all): one user; 64 users on a router's aggregate; the proxy's ceiling
LOADS = ((1, 100.0), (64, 1000.0), (64, 6400.0))
CONCURRENCY = tuple(sorted({clients for clients, _ in LOADS}))
EVENT = b'data: {"choices": [{"text": "x", "index": 0}]}\n\n'
LAST = b'data: {"timings": {"predicted_n": 16, "predicted_ms": 160.0}}\n\ndata: [DONE]\n\n'


@dataclass(frozen=True)
class Latency:
    """One concurrency's figures, ms: the percentiles direct and through the proxy, to the last byte and the
    first."""

    clients: int
    tokens_per_second: float  # streamed in all, by every client's answer together
    requests: int
    direct_p50: float
    direct_p99: float
    proxied_p50: float
    proxied_p99: float
    first_byte_added_p50: float
    round_added_p50: tuple[float, ...]  # each round pair's proxied p50 less its direct p50

    @property
    def added_p50(self) -> float:
        return self.proxied_p50 - self.direct_p50

    @property
    def added_p99(self) -> float:
        return self.proxied_p99 - self.direct_p99


# ------------------------------------------------------------------ the processes


def _fake_upstream(port: int) -> None:
    """A fast stand-in for the router: ``EVENTS`` SSE events ``?interval_ms=`` apart, then llama.cpp's timings."""

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        interval_s = float(request.query.get("interval_ms", "10")) / 1000.0
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(EVENTS):
            await response.write(EVENT)
            await asyncio.sleep(interval_s)
        await response.write(LAST)
        return response

    app = web.Application()
    app.router.add_post("/{tail:.*}", stream)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, handler_cancellation=True)


def _proxy(port: int, upstream: str, log: str) -> None:
    routing = Routing("bench", "bench", frozenset({"bench", "bench-code"}))
    with open(log, "a", buffering=1) as out:
        proxy = Proxy(routing, upstream, lambda line: print(line, file=out))
        asyncio.run(run_proxy(proxy, "127.0.0.1", port))


def _wait_listening(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:.0f} s")


# ------------------------------------------------------------------ the clients


Times = dict[str, list[list[tuple[float, float]]]]  # side -> round -> (to first byte, to last byte), seconds


async def _client(
    session: aiohttp.ClientSession, url: str, requests: int, out: list[tuple[float, float]], delay_s: float
) -> None:
    body = {"model": "any", "prompt": "def add(a, b):\n    return", "stream": True, "max_tokens": EVENTS}
    await asyncio.sleep(delay_s)
    for _ in range(requests):
        started = time.perf_counter()
        first = None
        async with session.post(url, json=body) as answer:
            async for _chunk in answer.content.iter_any():
                first = first or time.perf_counter()
        out.append(((first or time.perf_counter()) - started, time.perf_counter() - started))


async def _rounds(
    urls: dict[str, str], clients: int, requests: int, rounds: int, spread_s: float = 0.0
) -> Times:
    """Direct and proxied rounds alternating: each round ``clients`` streams at once, ``requests`` each, the
    clients' first requests spread evenly over ``spread_s`` (users arrive apart, not in the same millisecond)."""
    times: Times = {name: [] for name in urls}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for index in range(rounds):
            order = list(urls) if index % 2 == 0 else list(reversed(urls))
            for name in order:
                times[name].append([])
                await asyncio.gather(
                    *(
                        _client(session, urls[name], requests, times[name][-1], spread_s * i / clients)
                        for i in range(clients)
                    )
                )
    return times


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000.0


def _latency(clients: int, rate: float, times: Times) -> Latency:
    total = {name: [t for one in rounds for _, t in one] for name, rounds in times.items()}
    first = {name: [f for one in rounds for f, _ in one] for name, rounds in times.items()}
    pairs = zip(times["direct"], times["proxied"])
    round_added = tuple(
        _percentile([t for _, t in proxied], 0.5) - _percentile([t for _, t in direct], 0.5)
        for direct, proxied in pairs
    )
    return Latency(
        clients,
        rate,
        len(total["proxied"]),
        _percentile(total["direct"], 0.5),
        _percentile(total["direct"], 0.99),
        _percentile(total["proxied"], 0.5),
        _percentile(total["proxied"], 0.99),
        _percentile(first["proxied"], 0.5) - _percentile(first["direct"], 0.5),
        round_added,
    )


def measure_latency(rounds: int = 6, requests: int = 2) -> list[Latency]:
    """The proxy's added latency at each of ``LOADS``, in one run (fake upstream and proxy in processes of their
    own, the clients here); ``requests`` per client per round (x4 for one client)."""
    spawn = multiprocessing.get_context("spawn")
    upstream_port, proxy_port = free_port(), free_port()
    log = Path(tempfile.mkdtemp(prefix="serve-bench-")) / "access.log"
    processes = [
        spawn.Process(target=_fake_upstream, args=(upstream_port,), daemon=True),
        spawn.Process(
            target=_proxy, args=(proxy_port, f"http://127.0.0.1:{upstream_port}", str(log)), daemon=True
        ),
    ]
    for process in processes:
        process.start()
    try:
        _wait_listening(upstream_port)
        _wait_listening(proxy_port)
        found = []
        for clients, rate in LOADS:
            interval_ms = 1000.0 * clients / rate
            query = f"/v1/completions?interval_ms={interval_ms:g}"
            urls = {
                "direct": f"http://127.0.0.1:{upstream_port}{query}",
                "proxied": f"http://127.0.0.1:{proxy_port}{query}",
            }
            asyncio.run(_rounds(urls, min(clients, 4), 1, 1))  # warm-up: connections on both sides
            count = requests * 4 if clients == 1 else requests
            times = asyncio.run(_rounds(urls, clients, count, rounds, EVENTS * interval_ms / 1000.0))
            found.append(_latency(clients, rate, times))
        return found
    finally:
        for process in processes:
            process.terminate()
            process.join(10)


# ------------------------------------------------------------------ the classifier


def measure_accuracy() -> dict[str, tuple[int, int]]:
    """suite -> (held-out prompts classified as the suite's type, held-out prompts), every built-in suite."""
    workload = load_workload(list(BUILTIN_SUITES), Path("."))
    splits, _ = split(workload)
    by_id = {p.id: p for p in workload.prompts}
    found = {}
    for suite, held in splits.items():
        want = suite.removeprefix("chat-")
        bodies = [
            {"messages": [{"role": r, "content": c} for r, c in by_id[i].messages]}
            if by_id[i].chat
            else {"prompt": by_id[i].text}
            for i in held.held_out
        ]
        found[suite] = (sum(request_type(body) == want for body in bodies), len(bodies))
    return found


@dataclass(frozen=True)
class ServeBench:
    latency: list[Latency]
    accuracy: dict[str, tuple[int, int]]

    def to_dict(self) -> dict:
        return {
            "latency": [
                {**asdict(x), "added_p50": x.added_p50, "added_p99": x.added_p99} for x in self.latency
            ],
            "accuracy": {s: {"correct": c, "total": n} for s, (c, n) in self.accuracy.items()},
        }


def benchmark(rounds: int = 6, requests: int = 2) -> ServeBench:
    return ServeBench(measure_latency(rounds, requests), measure_accuracy())


def _by_round(added: tuple[float, ...]) -> str:
    return f"{statistics.median(added):.2f} [{min(added):.2f}, {max(added):.2f}] ({len(added)} rounds)"


def markdown(found: ServeBench) -> str:
    rows = [
        "| clients | tokens/s in all | requests | direct p50 ms | proxied p50 ms | added p50 ms | ratio p50 | direct p99 ms | "
        "proxied p99 ms | added p99 ms | ratio p99 | added to first byte p50 ms | added p50 by round: median [range] |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows += [
        f"| {x.clients} | {x.tokens_per_second:g} | {x.requests} | {x.direct_p50:.2f} | {x.proxied_p50:.2f} | {x.added_p50:.2f} | "
        f"x{x.proxied_p50 / x.direct_p50:.3f} | {x.direct_p99:.2f} | {x.proxied_p99:.2f} | {x.added_p99:.2f} | "
        f"x{x.proxied_p99 / x.direct_p99:.3f} | {x.first_byte_added_p50:.2f} | {_by_round(x.round_added_p50)} |"
        for x in found.latency
    ]
    correct = sum(c for c, _ in found.accuracy.values())
    total = sum(n for _, n in found.accuracy.values())
    rows += [
        "",
        f"Each request streams {EVENTS} SSE events from a fake, fast upstream (the proxy's own overhead; a real "
        "router's decode adds the same time to both sides), the events of all clients together at the tokens/s "
        "shown; direct and proxied rounds alternate. The last row is the proxy's ceiling, not a CPU router's load. "
        "The last column is each pair of neighbouring rounds' own added p50 (proxied less direct): a round's requests "
        "share its conditions, so these, not the requests, are the run's independent readings.",
        "",
        f"Classifier (`tuner.decisions.route.request_type`) on the built-in suites' held-out prompts: "
        f"{correct} of {total} ({100.0 * correct / max(total, 1):.0f}%): "
        + ", ".join(f"{s} {c}/{n}" for s, (c, n) in found.accuracy.items())
        + " (a `chat-X` suite counted right when taken for X).",
    ]
    return "\n".join(rows)
