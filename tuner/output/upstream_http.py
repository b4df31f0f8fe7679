"""``tuner serve``'s upstream leg: HTTP/1.1 to llama-server's router over kept-alive connections, one request
line, its headers and body out, the answer's status, headers and body back as they come.

Why not aiohttp's client (the side that faces clients stays aiohttp): a proxied request pays a second HTTP exchange
that a direct one does not, and aiohttp's client machinery (a session's timeouts, cookie and auth handling, payload
objects, traces) was most of what that exchange cost the proxy: the proxy's added latency at 64 streaming clients
was just over 1 ms on a 2-core machine (docs/evidence/serve-overhead.md). The peer is one known server the proxy
started or was told of, so what is needed is the framing of RFC 9112: a body is delimited by its
``Content-Length``, by ``chunked`` coding, or by the connection's close; a HEAD's answer, 1xx, 204 and 304 have none.
A connection goes back to the pool only once its answer was read to the end; a request that ends otherwise (the
client went away, the upstream broke off) closes it, which is how llama-server learns to stop generating.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from yarl import URL

CONNECT_S = 10.0
READ_LIMIT = 1 << 20  # the longest status line and header block accepted, and the read buffer's high mark
_CHUNK = 1 << 16


class UpstreamError(Exception):
    """The upstream did not answer: refused, reset or closed before a whole status line and headers, or sent
    something that is not HTTP/1.x."""


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False

    def close(self) -> None:
        self.writer.close()


@dataclass
class Answer:
    """The upstream's answer: its status and headers read, its body to come (``body()``), once."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    _connection: _Connection
    _framing: str  # "none", "length", "chunked" or "close"
    _length: int
    _pool: Upstream
    _reusable: bool
    _done: bool = field(default=False, init=False)

    @property
    def content_length(self) -> int | None:
        """The body's length where the upstream gave one (not under chunked coding)."""
        return self._length if self._framing == "length" else None

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((value for key, value in self.headers if key.lower() == name), None)

    async def body(self) -> AsyncIterator[bytes]:
        """The body's bytes as they come, the framing removed; a connection that breaks off is an
        ``UpstreamError``."""
        try:
            async for data in self._body():
                yield data
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as err:
            raise UpstreamError(_reason(err)) from None
        self._done = True

    async def _body(self) -> AsyncIterator[bytes]:
        reader = self._connection.reader
        if self._framing == "length":
            left = self._length
            while left:
                data = await reader.read(min(left, _CHUNK))
                if not data:
                    raise UpstreamError(f"closed with {left} of {self._length} bytes of the body to come")
                left -= len(data)
                yield data
        elif self._framing == "chunked":
            while size := _chunk_size(await _line(reader)):
                while size:
                    data = await reader.read(min(size, _CHUNK))
                    if not data:
                        raise UpstreamError("closed inside a chunk")
                    size -= len(data)
                    yield data
                if await _line(reader):
                    raise UpstreamError("a chunk longer than its size")
            while await _line(reader):  # trailer fields, dropped as hop-by-hop
                pass
        elif self._framing == "close":
            while data := await reader.read(_CHUNK):
                yield data

    def release(self) -> None:
        """The connection back to the pool when the body was read to the end and may be reused, else closed."""
        if self._done and self._reusable:
            self._pool.put(self._connection)
        else:
            self._connection.close()


class Upstream:
    """Kept-alive connections to one HTTP server (``http://`` or ``https://``, an optional path prefix)."""

    def __init__(self, base: str) -> None:
        assert is_http_url(base), (
            f"{base}: not an http:// or https:// URL with a host (checked where it is given)"
        )
        url = URL(base)
        self.host, self.port = url.host, url.port or (443 if url.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if url.scheme == "https" else None
        self._prefix = url.raw_path.rstrip("/")
        raw_host = url.raw_host or ""
        self._host_header = f"{raw_host}:{self.port}" if url.explicit_port else raw_host
        self._idle: list[_Connection] = []

    async def request(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> Answer:
        """Send one request (``target``: path and query, as received) and read its status and headers; a pooled
        connection the server has closed meanwhile is passed over (the request sent again on the next, a new one at
        the latest)."""
        head = _request_head(method, self._prefix + target, self._host_header, headers, body)
        while True:
            connection = await self._connection()
            try:
                connection.writer.write(head + body)
                return await self._answer(method, connection)
            except (ConnectionError, asyncio.IncompleteReadError, UpstreamError) as err:
                connection.close()
                if connection.reused and _nothing_read(err):
                    continue  # an idle connection the server closed: the request never reached it
                raise UpstreamError(_reason(err)) from None
            except BaseException:
                connection.close()
                raise

    def put(self, connection: _Connection) -> None:
        connection.reused = True
        self._idle.append(connection)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def _connection(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.writer.is_closing() and not connection.reader.at_eof():
                return connection
            connection.close()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self._ssl, limit=READ_LIMIT), CONNECT_S
            )
        except asyncio.TimeoutError:
            raise UpstreamError(f"no connection in {CONNECT_S:.0f} s") from None
        except OSError as err:
            raise UpstreamError(os.strerror(err.errno) if err.errno else str(err)) from None
        return _Connection(reader, writer)

    async def _answer(self, method: str, connection: _Connection) -> Answer:
        reader = connection.reader
        while True:
            try:
                block = await reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError:
                raise UpstreamError(f"a status line and headers longer than {READ_LIMIT} bytes") from None
            version, status, reason, headers = _parse_head(block)
            if not 100 <= status < 200 or status == 101:
                break  # 1xx interim answers are skipped
        fields = {key.lower(): value for key, value in headers}
        reusable = version == "HTTP/1.1" and "close" not in fields.get("connection", "").lower()
        codings = fields.get("transfer-encoding", "").lower()
        if method == "HEAD" or 100 <= status < 200 or status in (204, 304):
            framing, length = "none", 0
        elif codings:
            framing, length = (
                ("chunked", 0) if codings.rsplit(",", 1)[-1].strip() == "chunked" else ("close", 0)
            )
        elif "content-length" in fields:
            framing, length = "length", _content_length(fields["content-length"])
        else:
            framing, length = "close", 0
        reusable = reusable and framing != "close"
        return Answer(status, reason, headers, connection, framing, length, self, reusable)


def is_http_url(base: str) -> bool:
    """An ``http://`` or ``https://`` URL with a host: what ``Upstream`` connects to."""
    try:
        url = URL(base)
    except ValueError:
        return False
    return url.scheme in ("http", "https") and bool(url.host)


def _request_head(method: str, target: str, host: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    lines = [f"{method} {target or '/'} HTTP/1.1", f"Host: {host}"]
    lines += [f"{key}: {value}" for key, value in headers]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")


def _parse_head(block: bytes) -> tuple[str, int, str, list[tuple[str, str]]]:
    lines = block.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise UpstreamError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        if line:
            key, sep, value = line.partition(":")
            if not sep:
                raise UpstreamError(f"a header line without a colon: {line[:80]!r}")
            headers.append((key.strip(), value.strip()))
    return parts[0], int(parts[1]), parts[2] if len(parts) > 2 else "", headers


def _content_length(value: str) -> int:
    if not value.strip().isdigit():
        raise UpstreamError(f"Content-Length {value!r} is not a byte count")
    return int(value)


async def _line(reader: asyncio.StreamReader) -> bytes:
    line = await reader.readuntil(b"\r\n")
    return line[:-2]


def _chunk_size(line: bytes) -> int:
    try:
        return int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise UpstreamError(f"not a chunk size: {line[:40]!r}") from None


def _nothing_read(err: BaseException) -> bool:
    """The server closed the connection before a byte of the answer: the request can be sent again."""
    if isinstance(err, asyncio.IncompleteReadError):
        return not err.partial
    return isinstance(err, ConnectionError)


def _reason(err: BaseException) -> str:
    if isinstance(err, asyncio.IncompleteReadError):
        return "the connection closed mid-message" if err.partial else "the connection closed"
    return str(err) or type(err).__name__
