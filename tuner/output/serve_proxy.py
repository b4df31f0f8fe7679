"""``tuner serve STUDY``: one OpenAI-compatible endpoint in front of llama-server's router that sends each request
to its content type's tuned section.

Why: the router picks a configuration by the request's ``model`` field, and an application using the OpenAI
client, a chat front end or a gateway will not set it per request. The proxy reads each
``/v1/chat/completions``, ``/v1/completions`` and ``/completion`` body, picks its section
(``output/serve_routing``: the classifier export measured, the study's own sections), sets ``model`` and
forwards it; every other path and field passes through unchanged, a stream (SSE) chunk by chunk as the router
sends it.

The side that faces clients is aiohttp's server: asynchronous, so one process holds many streams at once without a
thread each, hardened against whatever a client sends, and a client that goes away cancels its handler
(``handler_cancellation``), which closes the upstream connection: llama-server stops generating for it. The
upstream leg is ``output/upstream_http`` (HTTP/1.1 over kept-alive connections to the one router), not aiohttp's
client, whose per-request machinery was most of the time the proxy added (that module says why). Faults answer in
one line each: a body that is not a JSON object gets a 400 with an OpenAI-style error object, an upstream that does
not answer a 502; nothing a request does ends the process.

Without ``--upstream`` the router is started here on the exported preset, as ``serve-router.sh`` starts it (on a
free localhost port), and stopped on exit.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from tuner.errors import UserError
from tuner.machine.llama_build import binary
from tuner.measurement.server_process import free_port
from tuner.output.serve_metrics import ResponseReader, ServeMetrics
from tuner.output.serve_routing import ROUTED_PATHS, Routing, study_routing
from tuner.output.upstream_http import Answer, Upstream, UpstreamError, is_http_url

MAX_BODY = 256 * 1024 * 1024  # a long conversation's body, far above aiohttp's 1 MiB default
ROUTER_READY_S = 90.0
# hop-by-hop headers (RFC 9110 7.6.1) and those the proxy's own connections set
_NOT_FORWARDED = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)


def _log_line(line: str) -> None:
    print(f"tuner serve: {line}", file=sys.stderr, flush=True)


def error_body(status: int, message: str, kind: str) -> dict:
    """An OpenAI-style error object (llama-server's own shape: message, type, code)."""
    return {"error": {"message": message, "type": kind, "code": status}}


def _headers(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The end-to-end headers of one message, each repeat kept (a client's or the router's Set-Cookie lines)."""
    return [(key, value) for key, value in pairs if key.lower() not in _NOT_FORWARDED]


class Proxy:
    """The endpoint: routing, forwarding, the access line per request, ``/metrics``."""

    def __init__(self, routing: Routing, upstream: str, log: Callable[[str], None] = _log_line) -> None:
        self.routing = routing
        self.upstream = upstream.rstrip("/")
        self.log = log
        self.metrics = ServeMetrics()
        self._upstream: Upstream | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        self._upstream = Upstream(self.upstream)

    async def _close(self, _app: web.Application) -> None:
        if self._upstream is not None:
            self._upstream.close()

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(text=self.metrics.page(), content_type="text/plain", charset="utf-8")

    async def forward(self, request: web.Request) -> web.StreamResponse:
        """One request: refused in one line, or routed (when classified) and relayed; never raises but a
        cancellation (the client went away)."""
        started = time.perf_counter()
        where = f"{request.method} {request.path}"
        relayed = False  # from there on, _relay writes the access line
        try:
            body = await request.read()
            kind = section = None
            if request.method == "POST" and request.path in ROUTED_PATHS:
                parsed, why = _json_object(body)
                if parsed is None:
                    return self._refuse(where, 400, why, "invalid_request_error")
                kind, section = self.routing.pick(parsed)
                body = json.dumps({**parsed, "model": section}).encode()
            relayed = True
            return await self._relay(request, body, where, (kind, section), started)
        except asyncio.CancelledError:
            if not relayed:
                self.log(f"{where} the client went away after {_ms(started)}, before it was sent upstream")
            raise
        except Exception as err:  # a proxy fault answers this request only; the process keeps serving
            return self._refuse(where, 500, f"internal error: {type(err).__name__}: {err}", "server_error")

    async def _relay(
        self,
        request: web.Request,
        body: bytes,
        where: str,
        routed: tuple[str | None, str | None],
        started: float,
    ) -> web.StreamResponse:
        """The request sent upstream and its answer copied back as it comes; its access line and counts once it
        ends, however it ends (a client that closes after the last event it wanted is still counted)."""
        assert self._upstream is not None, "the upstream opens with the app"
        kind, section = routed
        try:
            upstream = await self._upstream.request(
                request.method, request.raw_path, _headers(request.headers.items()), body
            )
        except UpstreamError as err:
            return self._refuse(where, 502, f"upstream {self.upstream} did not answer: {err}", "server_error")
        except asyncio.CancelledError:
            self.log(f"{where} the client went away after {_ms(started)}: its upstream request cancelled")
            raise
        reader = ResponseReader("text/event-stream" in (upstream.header("Content-Type") or ""))
        cut = ""
        try:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason or None)
            for key, value in _headers(upstream.headers):
                response.headers.add(key, value)
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            cut = await _copy(upstream, response, reader if kind is not None else None)
            if not cut:
                cut = await _end(response)
            return response
        except asyncio.CancelledError:
            cut = "; the client went away: its upstream request cancelled"
            raise
        finally:
            upstream.release()
            if kind is not None and section is not None:
                self.metrics.routed(section, kind, reader.answer())
            routed_text = "" if kind is None else f" type={kind} section={section}"
            self.log(f"{where} {upstream.status}{routed_text} {_ms(started)}{cut}")

    def _refuse(self, where: str, status: int, message: str, kind: str) -> web.Response:
        self.metrics.refuse(str(status))
        self.log(f"{where} {status} {message}")
        return web.json_response(error_body(status, message, kind), status=status)


async def _copy(upstream: Answer, response: web.StreamResponse, reader: ResponseReader | None) -> str:
    """The upstream's body written to the client as it comes; how it broke off ("" if it did not)."""
    try:
        async for chunk in upstream.body():
            if reader is not None:
                reader.feed(chunk)
            await response.write(chunk)
    except UpstreamError as err:
        response.force_close()
        return f"; the upstream broke off: {err}"
    except ConnectionResetError:
        return "; the client went away"
    return ""


async def _end(response: web.StreamResponse) -> str:
    """The response ended now (a stream's last chunk sent), so the client's last byte does not wait for the access
    line and the counts written after it; how it broke off ("" if it did not)."""
    try:
        await response.write_eof()
    except ConnectionResetError:
        return "; the client went away"
    return ""


def _json_object(body: bytes) -> tuple[dict | None, str]:
    """The body as a JSON object, or None and why not."""
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        return None, f"the request body is not JSON ({err}); send a JSON object"
    if not isinstance(parsed, dict):
        return None, f"the request body is JSON {type(parsed).__name__}, not an object; send a JSON object"
    return parsed, ""


def _ms(started: float) -> str:
    return f"{(time.perf_counter() - started) * 1000:.1f} ms"


# ------------------------------------------------------------------ the process: router and proxy


@dataclass
class Router:
    """llama-server's router started on the preset, in its own process group."""

    process: subprocess.Popen
    url: str
    log: Path

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the group (the router stops its children), then SIGKILL what is left."""
        if self.process.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue


def start_router(preset: Path, sections: int, server: Path, log: Path) -> Router:
    """The router on ``preset`` at a free localhost port, ready (``/health``), its output in ``log``."""
    port = free_port()
    argv = [str(server), "--models-preset", str(preset.resolve()), "--models-max", str(sections)]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    router = Router(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + ROUTER_READY_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise UserError(f"{server}: the router exited ({process.returncode}) on {preset}; its log: {log}")
        try:
            with urllib.request.urlopen(router.url + "/health", timeout=2) as answer:
                if answer.status == 200:
                    return router
        except OSError:
            time.sleep(0.2)
    router.stop()
    raise UserError(
        f"{server}: the router was not ready in {ROUTER_READY_S:.0f} s on {preset}; its log: {log}"
    )


async def run_proxy(proxy: Proxy, host: str, port: int, ready: Callable[[str], None] | None = None) -> None:
    """Serve until cancelled (Ctrl-C, SIGTERM); a port already taken is one line."""
    runner = web.AppRunner(proxy.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as err:
            raise UserError(f"--host {host} --port {port}: cannot listen there ({err.strerror})") from None
        # Everything alive now lives as long as the process: out of the collector's sight, a full collection
        # walks only what requests create (a few thousand objects, not the ~40,000 of the imports), so the
        # pause it puts on every stream in flight stays well under a millisecond.
        gc.collect()
        gc.freeze()
        if ready is not None:
            ready(f"http://{host}:{port}")
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def serve(
    study: str, preset: Path, host: str, port: int, upstream: str | None, bin_dir: Path | None = None
) -> int:
    """``tuner serve``: the study's sections read, the router started (unless ``upstream``), the proxy served
    until Ctrl-C or SIGTERM, the router stopped."""
    if upstream is not None and not is_http_url(upstream):
        raise UserError(f"--upstream {upstream}: not an http:// URL; name the router as http://HOST:PORT")
    routing = study_routing(preset, study)
    router = None
    if upstream is None:
        log = preset.parent / f"{routing.pooled}.router.log"
        router = start_router(preset, len(routing.sections), binary("llama-server", bin_dir), log)
        upstream = router.url
        _log_line(f"router on {preset} at {upstream}, its log in {log}")
    sections = ", ".join(sorted(routing.sections))

    def ready(url: str) -> None:
        _log_line(f"{url} -> {upstream}: study {study}'s sections {sections}; metrics at {url}/metrics")

    try:
        asyncio.run(run_proxy(Proxy(routing, upstream), host, port, ready))
    except KeyboardInterrupt:
        _log_line("stopped")
    finally:
        if router is not None:
            router.stop()
    return 0
