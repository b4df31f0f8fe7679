"""``tuner serve``'s upstream leg (``output/upstream_http``) against a server that answers scripted bytes: each of
RFC 9112's body framings, a connection pooled only when its answer was read to the end, a pooled connection the
server closed retried once, and what breaks off named."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from tuner.measurement.server_process import free_port
from tuner.output.upstream_http import Upstream, UpstreamError

LENGTH = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n"
)
# path -> (the bytes answered, whether the server closes the connection after them)
Answers = dict[bytes, tuple[bytes, bool]]


class ScriptedServer:
    """Reads each request on a connection (head and Content-Length body) and writes the answer its path names."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.connections = 0
        self.requests: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.lower().split(b"\r\n")
                length = next((int(line[15:]) for line in lines if line.startswith(b"content-length:")), 0)
                self.requests.append(head + await reader.readexactly(length))
                answer, close = self.answers[head.split(b" ")[1]]
                writer.write(answer)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    def close_idle(self) -> None:
        """Close every connection from the server's side, as llama-server does with one idle past its timeout."""
        for writer in self.writers:
            writer.close()


def scenario(answers: Answers, check: Callable[[Upstream, ScriptedServer], Awaitable[None]]) -> None:
    async def run() -> None:
        server = ScriptedServer(answers)
        port = free_port()
        listening = await asyncio.start_server(server.handle, "127.0.0.1", port)
        upstream = Upstream(f"http://127.0.0.1:{port}")
        try:
            await check(upstream, server)
        finally:
            upstream.close()
            listening.close()
            server.close_idle()

    asyncio.run(run())


async def whole(upstream: Upstream, target: str, method: str = "GET", body: bytes = b"") -> tuple[int, bytes]:
    answer = await upstream.request(method, target, [("X-Client", "yes")], body)
    try:
        return answer.status, b"".join([chunk async for chunk in answer.body()])
    finally:
        answer.release()


def test_each_framing_gives_the_body_and_a_connection_is_pooled_only_when_its_end_is_known():
    answers = {
        b"/length": (LENGTH, False),
        b"/chunked": (CHUNKED, False),
        b"/close": (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", True),
        b"/http10": (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", True),
    }

    async def check(upstream, server):
        assert await whole(upstream, "/length") == (200, b"hello")
        assert await whole(upstream, "/chunked") == (200, b"hello, world")
        assert server.connections == 1  # both on one kept-alive connection
        assert await whole(upstream, "/close") == (200, b"until the end")
        assert await whole(upstream, "/http10") == (200, b"ok")
        assert await whole(upstream, "/length") == (200, b"hello")
        assert server.connections == 3  # neither the close-delimited nor the HTTP/1.0 answer's was pooled

    scenario(answers, check)


def test_head_204_and_304_answers_have_no_body_and_keep_the_connection():
    answers = {
        b"/head": (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", False),
        b"/none": (b"HTTP/1.1 204 No Content\r\n\r\n", False),
        b"/same": (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
            False,
        ),
        b"/length": (LENGTH, False),
    }

    async def check(upstream, server):
        assert await whole(upstream, "/head", method="HEAD") == (200, b"")
        assert await whole(upstream, "/none") == (204, b"")
        assert await whole(upstream, "/same") == (304, b"")  # the interim 100 skipped
        assert await whole(upstream, "/length") == (200, b"hello")
        assert server.connections == 1

    scenario(answers, check)


def test_the_request_carries_its_line_headers_body_and_length():
    async def check(upstream, server):
        assert await whole(upstream, "/v1/completions?x=%2F", method="POST", body=b'{"a": 1}') == (
            200,
            b"hello",
        )
        assert await whole(upstream, "/v1/completions?x=%2F", method="POST") == (200, b"hello")
        first, empty = server.requests
        assert first.startswith(b"POST /v1/completions?x=%2F HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"\r\nX-Client: yes\r\n" in first and b"\r\nContent-Length: 8\r\n" in first
        assert first.endswith(b'\r\n\r\n{"a": 1}') and b"\r\nContent-Length: 0\r\n" in empty

    scenario({b"/v1/completions?x=%2F": (LENGTH, False)}, check)


def test_a_pooled_connection_the_server_closed_is_retried_once_on_a_new_one():
    async def check(upstream, server):
        assert await whole(upstream, "/length") == (200, b"hello")
        server.close_idle()
        await asyncio.sleep(0.1)  # the close reaches the pooled connection
        assert await whole(upstream, "/length") == (200, b"hello")
        assert server.connections == 2 and len(server.requests) == 2

    scenario({b"/length": (LENGTH, False)}, check)


def test_what_breaks_off_is_an_upstream_error_naming_it():
    answers = {
        b"/cut": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", True),
        b"/short": (b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nhello", True),
        b"/nonsense": (b"SSH-2.0-OpenSSH\r\n\r\n", True),
        b"/silent": (b"", True),
    }

    async def check(upstream, server):
        for target, said in (("/cut", "closed"), ("/short", "45 of 50 bytes")):
            answer = await upstream.request("GET", target, [], b"")
            with pytest.raises(UpstreamError, match=said):
                [chunk async for chunk in answer.body()]
            answer.release()
        with pytest.raises(UpstreamError, match="not an HTTP/1.x status line"):
            await upstream.request("GET", "/nonsense", [], b"")
        with pytest.raises(UpstreamError, match="the connection closed"):
            await upstream.request("GET", "/silent", [], b"")

    scenario(answers, check)


def test_an_upstream_that_refuses_is_an_upstream_error():
    async def check() -> None:
        with pytest.raises(UpstreamError, match="refused"):
            await Upstream(f"http://127.0.0.1:{free_port()}").request("GET", "/health", [], b"")

    asyncio.run(check())
