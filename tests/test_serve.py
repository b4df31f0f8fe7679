"""``tuner serve`` (issue 61): the routing decision, the proxy against a small fake upstream (an aiohttp app in
the test: faults, streaming, cancellation), and the official OpenAI client through the proxy against the real
router on the synthetic family."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from tuner.cli import main
from tuner.errors import UserError
from tuner.measurement.server_process import free_port
from tuner.output.serve_metrics import ResponseReader
from tuner.output.serve_proxy import Proxy, run_proxy
from tuner.output.serve_routing import study_routing

# a preset as `tuner export --per-type` writes it, with another study's sections beside it
PRESET = """version = 1

[*]
c = 1024

[demo]
; tuner export: study demo, trial 3 (max-tps)
model = {model}

[demo-code]
; tuner export: study demo, trial 5 (per-type)
model = {model}

[demo-c2]
; tuner export: study demo, trial 7 (by-load)
model = {model}
parallel = 2

[demo-json]
; tuner export: study demo-json, trial 1 (max-tps)
model = {model}

[hand-written]
model = {model}
"""

CODE = "def add(a, b):\n    return"
PROSE = "Once upon a time there was a lighthouse keeper who"


def write_preset(path: Path, model: str = "/m/t.gguf") -> Path:
    path.write_text(PRESET.format(model=model))
    return path


# ------------------------------------------------------------------ the routing decision


def test_the_study_s_sections_are_those_its_export_wrote(tmp_path):
    routing = study_routing(write_preset(tmp_path / "p.ini"), "demo")
    assert routing.pooled == "demo" and routing.sections == {"demo", "demo-code", "demo-c2"}


def test_a_request_goes_to_its_type_s_section_else_the_pooled_one_and_a_named_section_is_kept(tmp_path):
    routing = study_routing(write_preset(tmp_path / "p.ini"), "demo")
    assert routing.pick({"prompt": CODE}) == ("code", "demo-code")
    assert routing.pick({"prompt": PROSE, "model": "gpt-4o"}) == ("prose", "demo")
    # json has a section of that name, but another study's: not ours
    assert routing.pick({"prompt": '{"name": "Ada", "age":'}) == ("json", "demo")
    chat = {"messages": [{"role": "user", "content": PROSE}, {"role": "user", "content": CODE}]}
    assert routing.pick(chat) == ("code", "demo-code")  # the last user message
    assert routing.pick({"prompt": CODE, "model": "demo-c2"}) == ("code", "demo-c2")
    assert routing.pick({"prompt": PROSE, "model": "demo-code"}) == ("prose", "demo-code")
    assert routing.pick({"prompt": PROSE, "model": "demo-json"}) == ("prose", "demo")


def test_a_chat_request_goes_to_its_chat_suite_s_section_first(tmp_path):
    """The export names a section by its suite: a chat about code was measured as ``chat-code``."""
    preset = write_preset(tmp_path / "p.ini")
    preset.write_text(
        preset.read_text() + "\n[demo-chat-code]\n; tuner export: study demo, trial 9 (per-type)\n"
    )
    routing = study_routing(preset, "demo")
    chat = {"messages": [{"role": "user", "content": CODE}]}
    assert routing.pick(chat) == ("code", "demo-chat-code")
    assert routing.pick({"prompt": CODE}) == ("code", "demo-code")  # a completion is not a chat
    prose_chat = {"messages": [{"role": "user", "content": PROSE}]}
    assert routing.pick(prose_chat) == ("prose", "demo")


def test_a_missing_preset_or_study_or_an_upstream_that_is_no_url_is_one_line_naming_the_fix(tmp_path, capsys):
    with pytest.raises(UserError, match=r"no such preset file; run `tuner export demo` first"):
        study_routing(tmp_path / "none.ini", "demo")
    with pytest.raises(
        UserError, match=r"no section \[other\] exported from study other \(studies exported "
    ):
        study_routing(write_preset(tmp_path / "p.ini"), "other")
    assert main(["serve", "other", "--preset", str(tmp_path / "p.ini"), "--upstream", "http://x"]) == 2
    for upstream in ("127.0.0.1:9000", "http://", "ftp://x:1"):
        assert main(["serve", "demo", "--preset", str(tmp_path / "p.ini"), "--upstream", upstream]) == 2
        assert (
            f"--upstream {upstream}: not an http:// URL; name the router as http://HOST:PORT"
            in capsys.readouterr().err
        )


def test_a_port_already_taken_is_one_line(tmp_path, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["serve", "demo", "--preset", str(write_preset(tmp_path / "p.ini")), "--port", str(port)]
        assert main([*argv, "--upstream", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert f"--host 127.0.0.1 --port {port}: cannot listen there" in err and "Traceback" not in err


def test_a_stream_s_counts_are_read_from_its_last_events_across_chunk_boundaries():
    reader = ResponseReader(streamed=True)
    events = b'data: {"choices": [{"text": "a"}]}\n\ndata: {"usage": {"completion_tokens": 7}}\n\n'
    events += b'data: {"timings": {"predicted_n": 7, "predicted_ms": 70.0}}\n\ndata: [DONE]\n\n'
    for i in range(0, len(events), 5):
        reader.feed(events[i : i + 5])
    assert reader.answer() == {
        "usage": {"completion_tokens": 7},
        "timings": {"predicted_n": 7, "predicted_ms": 70.0},
    }


# ------------------------------------------------------------------ against a fake upstream


class FakeUpstream:
    """An aiohttp app standing in for the router: it records each request and answers as llama-server does."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes]] = []  # method, path with query, body
        self.cookies: list[str] = []  # each request's Cookie header ("" without one)
        self.release = asyncio.Event()  # the streamed answer's last event waits for it
        self.gone = asyncio.Event()  # a slow stream's handler ended early: its client went away

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/slow", self.slow)
        app.router.add_route("*", "/slow-answer", self.slow_answer)
        app.router.add_route("*", "/{tail:.*}", self.answer)
        return app

    async def answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append((request.method, request.raw_path, body))
        self.cookies.append(request.headers.get("Cookie", ""))
        if request.path == "/v1/models":
            headers = {"X-Upstream": "yes", "Set-Cookie": "session=first-client; Path=/"}
            return web.json_response({"data": [{"id": "demo"}]}, headers=headers)
        parsed = json.loads(body) if request.path.startswith(("/v1/", "/completion")) else {}
        if not parsed.get("stream"):
            timings = {"predicted_n": 10, "predicted_ms": 100.0}
            return web.json_response(
                {"model": parsed.get("model"), "usage": {"completion_tokens": 10}, "timings": timings}
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"text": "x"}]}\n\n')
        await asyncio.wait_for(self.release.wait(), 10)
        await response.write(
            b'data: {"timings": {"predicted_n": 4, "predicted_ms": 20.0}}\n\ndata: [DONE]\n\n'
        )
        return response

    async def slow_answer(self, request: web.Request) -> web.Response:
        """An answer that takes long to come, as a long non-streamed completion does."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.gone.set()
            raise
        return web.json_response({})

    async def slow(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for _ in range(200):
                await response.write(b'data: {"choices": [{"text": "x"}]}\n\n')
                await asyncio.sleep(0.05)
        except (asyncio.CancelledError, ConnectionResetError):
            self.gone.set()
            raise
        return response


async def logged(lines: list[str], count: int, timeout_s: float = 5.0) -> None:
    """Wait for the proxy's access lines: it writes one once a response's last byte is sent."""
    deadline = time.monotonic() + timeout_s
    while len(lines) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


async def serving(app: web.Application, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


Check = Callable[[aiohttp.ClientSession, str, FakeUpstream, list[str], Proxy], Awaitable[None]]


def through_proxy(
    tmp_path: Path, check: Check, upstream_up: bool = True, upstream_host: str = "127.0.0.1"
) -> None:
    """Run ``check(client, proxy_url, fake, log_lines, proxy)`` with the proxy in front of the fake upstream."""

    async def scenario() -> None:
        fake, lines = FakeUpstream(), []
        upstream_port, proxy_port = free_port(), free_port()
        routing = study_routing(write_preset(tmp_path / "p.ini"), "demo")
        proxy = Proxy(routing, f"http://{upstream_host}:{upstream_port}", lines.append)
        upstream = await serving(fake.app(), upstream_port) if upstream_up else None
        ready = asyncio.Event()
        task = asyncio.create_task(run_proxy(proxy, "127.0.0.1", proxy_port, lambda _url: ready.set()))
        await asyncio.wait_for(ready.wait(), 10)
        try:
            async with aiohttp.ClientSession() as client:
                await check(client, f"http://127.0.0.1:{proxy_port}", fake, lines, proxy)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if upstream is not None:
                await upstream.cleanup()

    asyncio.run(scenario())


def test_each_request_is_routed_by_type_logged_in_one_line_and_counted(tmp_path):
    async def check(client, url, fake, lines, proxy):
        chat = {"model": "gpt-4o", "messages": [{"role": "user", "content": CODE}], "temperature": 0}
        async with client.post(url + "/v1/chat/completions", json=chat) as answer:
            assert answer.status == 200 and (await answer.json())["model"] == "demo-code"
        async with client.post(url + "/completion", json={"prompt": PROSE, "n_predict": 4}) as answer:
            assert (await answer.json())["model"] == "demo"
        forwarded = json.loads(fake.seen[0][2])
        assert forwarded == {**chat, "model": "demo-code"}  # every other field as sent
        await logged(lines, 2)  # a request's line and counts follow its last byte
        assert lines[0].startswith("POST /v1/chat/completions 200 type=code section=demo-code ")
        assert lines[1].startswith("POST /completion 200 type=prose section=demo ") and len(lines) == 2
        async with client.get(url + "/metrics") as answer:
            page = await answer.text()
        assert 'tuner_serve_requests_total{section="demo-code",type="code"} 1' in page
        assert 'tuner_serve_output_tokens_total{section="demo",type="prose"} 10' in page
        assert 'tuner_serve_decode_tokens_per_second{section="demo",type="prose"} 100' in page

    through_proxy(tmp_path, check)


def test_other_paths_and_bodies_pass_through_unchanged(tmp_path):
    async def check(client, url, fake, lines, proxy):
        async with client.get(URL(url + "/v1/models?model=demo&x=%2F", encoded=True)) as answer:
            assert answer.headers["X-Upstream"] == "yes" and (await answer.json())["data"][0]["id"] == "demo"
        raw = b"not json \x00 at all"
        async with client.post(url + "/tokenize", data=raw) as answer:
            assert answer.status == 200
        assert fake.seen[0][:2] == ("GET", "/v1/models?model=demo&x=%2F")
        assert fake.seen[1] == ("POST", "/tokenize", raw)
        await logged(lines, 2)
        assert lines[0].startswith("GET /v1/models 200 ") and "type=" not in lines[0]

    through_proxy(tmp_path, check)


def test_a_cookie_the_upstream_sets_reaches_its_client_and_no_other_request(tmp_path):
    """The proxy's upstream connections are shared by every client: a cookie the upstream sets goes back to the
    client that asked, and is never sent with another's request (a client with a cookie jar, such as aiohttp's
    default one, would keep a named host's cookies: the upstream is named here)."""

    async def check(client, url, fake, lines, proxy):
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as first:
            async with first.get(url + "/v1/models") as answer:
                assert answer.headers["Set-Cookie"].startswith("session=first-client")
        async with client.post(url + "/tokenize", data=b"x") as answer:
            assert answer.status == 200
        assert fake.cookies == ["", ""]

    through_proxy(tmp_path, check, upstream_host="localhost")


def test_a_stream_passes_chunk_by_chunk_and_its_counts_are_read(tmp_path):
    async def check(client, url, fake, lines, proxy):
        body = {"prompt": CODE, "stream": True, "max_tokens": 4}
        async with client.post(url + "/v1/completions", json=body) as answer:
            assert answer.headers["Content-Type"].startswith("text/event-stream")
            first = await asyncio.wait_for(answer.content.readline(), 10)  # before the upstream's last event
            assert first.startswith(b"data: ") and not fake.release.is_set()
            fake.release.set()
            rest = await answer.content.read()
        assert rest.endswith(b"data: [DONE]\n\n")
        await logged(lines, 1)
        tally = proxy.metrics.tallies[("demo-code", "code")]
        assert (tally.requests, tally.output_tokens, tally.decode_tokens) == (1, 4, 4)

    through_proxy(tmp_path, check)


def test_a_malformed_body_gets_a_400_error_object_one_log_line_and_the_next_request_is_served(tmp_path):
    async def check(client, url, fake, lines, proxy):
        for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
            async with client.post(url + "/v1/chat/completions", data=raw) as answer:
                assert answer.status == 400
                error = (await answer.json())["error"]
                assert error["code"] == 400 and error["type"] == "invalid_request_error"
                assert "send a JSON object" in error["message"]
        assert len(lines) == 3 and all(line.startswith("POST /v1/chat/completions 400 ") for line in lines)
        assert all("\n" not in line for line in lines) and fake.seen == []
        async with client.post(url + "/v1/completions", json={"prompt": CODE}) as answer:
            assert answer.status == 200
        async with client.get(url + "/metrics") as answer:
            assert 'tuner_serve_refused_total{reason="400"} 3' in await answer.text()

    through_proxy(tmp_path, check)


def test_an_upstream_that_is_down_gets_a_502_in_one_line(tmp_path):
    async def check(client, url, fake, lines, proxy):
        for _ in range(2):  # and the proxy still answers
            async with client.post(url + "/v1/completions", json={"prompt": CODE}) as answer:
                assert answer.status == 502
                error = (await answer.json())["error"]
                assert error["code"] == 502 and "did not answer" in error["message"]
        assert len(lines) == 2 and lines[0].startswith("POST /v1/completions 502 upstream http://127.0.0.1:")

    through_proxy(tmp_path, check, upstream_up=False)


def test_a_client_that_goes_away_cancels_its_upstream_request(tmp_path):
    async def check(client, url, fake, lines, proxy):
        answer = await client.post(url + "/slow", json={"stream": True})
        assert (await answer.content.readline()).startswith(b"data: ")
        answer.close()  # the client goes away mid-stream
        await asyncio.wait_for(fake.gone.wait(), 5)  # the upstream saw its connection close
        await logged(lines, 1)
        assert any("client went away" in line for line in lines)
        fake.gone.clear()
        with pytest.raises(asyncio.TimeoutError):  # a client that gives up waiting for a whole answer
            await client.post(url + "/slow-answer", json={}, timeout=aiohttp.ClientTimeout(total=0.5))
        await asyncio.wait_for(fake.gone.wait(), 5)
        async with client.get(url + "/v1/models") as answer:
            assert answer.status == 200

    through_proxy(tmp_path, check)


# ------------------------------------------------------------------ the real router, the official client


@pytest.mark.llama
@pytest.mark.slow
def test_the_openai_client_through_the_exported_proxy_lands_each_type_on_its_section(
    synthetic_models, tmp_path
):
    """The export's serve-proxy.sh (tuner serve, which starts the real router on the preset) under the official
    OpenAI client: chat and completions, streamed and not; code lands on synth-code, prose on synth."""
    import os

    from conftest import running_llama_processes
    from fake_llama_server import get_json, stop_group, wait_for, wait_for_json
    from openai import OpenAI
    from test_export import start
    from test_per_type import served_export

    from tuner.output.export import write_export

    out, preset = tmp_path / "export", tmp_path / "models-preset.ini"
    write_export(served_export("synth", 3, 2), out, preset, [served_export("synth", 5, 4, "synth-code")])
    unit = (out / "llama-tuner-synth.service").read_text()
    assert (
        f"ExecStart={(out / 'serve-proxy.sh').resolve()}" in unit
        and "./serve-proxy.sh" in (out / "ROUTER.md").read_text()
    )
    port = free_port()
    env = {**os.environ, "TUNER_SERVE_PORT": str(port)}
    proc = start([str(out / "serve-proxy.sh")], tmp_path / "serve.log", env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_json(proc, f"{base}/health", 90, "tuner serve and its router")
        client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
        landed = {}
        for kind, text in (("code", CODE), ("prose", PROSE)):
            chat = [{"role": "user", "content": text}]
            answer = client.chat.completions.create(model="any", messages=chat, max_tokens=8, temperature=0)
            landed[("chat", kind)] = {answer.model}
            chunks = client.chat.completions.create(
                model="any", messages=chat, max_tokens=8, temperature=0, stream=True
            )
            landed[("chat-stream", kind)] = {c.model for c in chunks}
            completion = client.completions.create(model="any", prompt=text, max_tokens=8, temperature=0)
            assert completion.choices[0].text or completion.usage.completion_tokens > 0
            landed[("completion", kind)] = {completion.model}
            streamed = client.completions.create(
                model="any", prompt=text, max_tokens=8, temperature=0, stream=True
            )
            landed[("completion-stream", kind)] = {c.model for c in streamed}
        want = {"code": {"synth-code"}, "prose": {"synth"}}
        assert landed == {key: want[key[1]] for key in landed}, landed
        loaded = {m["id"]: m["status"]["value"] for m in get_json(f"{base}/models")["data"]}  # passed through
        assert loaded["synth"] == "loaded" and loaded["synth-code"] == "loaded", loaded
        counted = (
            'tuner_serve_requests_total{section="synth-code",type="code"} 4',
            'tuner_serve_requests_total{section="synth",type="prose"} 4',
        )

        def metrics() -> bool:  # a stream is counted once its upstream ends, a moment after its [DONE]
            with urllib.request.urlopen(f"{base}/metrics", timeout=5) as page:
                text = page.read().decode()
            return all(line in text for line in counted)

        wait_for(metrics, 10, "every request counted in /metrics")
    finally:
        stop_group(proc)  # SIGTERM to tuner serve: it stops the router it started
    wait_for(lambda: not running_llama_processes(), 30, "the router and its children to stop")
    access = (tmp_path / "serve.log").read_text()
    assert access.count("POST /v1/chat/completions 200 type=code section=synth-code") == 2, access
    # the router's own word on where each request went (tuner serve keeps its log beside the preset)
    router_log = (tmp_path / "synth.router.log").read_text(errors="replace")
    proxied = re.findall(r"proxying request to model (\S+) on port", router_log)
    assert sorted(proxied) == ["synth"] * 4 + ["synth-code"] * 4, proxied


def test_the_proxy_s_process_imports_neither_pandas_nor_optuna():
    """A full collection over their objects (50-70 ms) stalled every stream in flight: it was the proxy's p99."""
    import subprocess
    import sys

    probe = "import sys, tuner.commands.serve; print(sorted({'pandas', 'optuna'} & set(sys.modules)))"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]", found.stdout + found.stderr
