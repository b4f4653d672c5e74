"""The gateway's connections to one upstream process: an httpx transport of its own.

The gateway speaks to each channel's process (llama-server, vLLM, SGLang) in
``httpx.Request``s and ``httpx.Response``s through an ``UpstreamTransport``: one
pool of keep-alive HTTP/1.1 connections per upstream, each lent to one request
at a time, with the answers parsed by llhttp (``httptools``, the parser uvicorn
uses). httpx's own transport parses every streamed chunk in Python (h11) and
looks through its whole pool on every request, and its client's redirect,
auth and cookie handling cost a tenth of a streamed request's CPU: the gateway
hands its requests to the transport itself (``client_for`` gives a whole
``httpx.AsyncClient`` over it).

A connection whose answer was not read to the end is closed, never reused:
closing it is how an upstream request is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import httptools
import httpx

# Reading from an upstream pauses while this much of its answer waits for a slow client.
HIGH_WATER = 256 * 1024


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection, reading one answer at a time (asyncio protocol and llhttp callbacks)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.cancelled = False
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        # Called whenever more of the answer arrived, it ended or the connection failed (for an
        # exchange carried by callbacks, ``gateway.serve.fast_lane``), instead of a waiting task.
        self.listener: Callable[[], None] | None = None
        # llhttp hands each chunk of a chunked body over on its own: straight into the list.
        self.body: list[bytes] = []
        self.on_body = self.body.append
        self._reset()
        self.parser = httptools.HttpResponseParser(self)  # one per connection: answers follow answers

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.keep_alive = False
        self.complete = False
        self.received = 0
        self.taken = 0  # ``received`` when the body was last taken: what is buffered is the rest
        self.body.clear()
        self.error: Exception | None = None
        self._eof_ends_body = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"the upstream's answer is not valid HTTP: {exc}"))
            self.abort()
        if self.buffered > HIGH_WATER and self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.head_done and not self.complete and self._eof_ends_body and exc is None:
            self.complete = True
        elif not self.complete and self.error is None:
            self.error = httpx.ReadError(
                "the upstream closed the connection"
                + ("" if self.head_done else " before it answered")
                + (f": {exc}" if exc else "")
            )
        self._wake()

    # llhttp callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        names = {name.lower() for name, _ in self.headers}
        self._eof_ends_body = b"content-length" not in names and b"transfer-encoding" not in names
        self.keep_alive = self.parser.should_keep_alive()
        self.head_done = True

    def on_message_complete(self) -> None:
        self.complete = True

    # Used by the transport and the stream

    @property
    def buffered(self) -> int:
        """About how many bytes of the answer wait to be taken (its head and framing count too)."""
        return self.received - self.taken

    def _fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if self.listener is not None:
            self.listener()

    async def wait(self) -> None:
        """Until more of the answer arrived, it ended, or the connection failed."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def take(self) -> bytes:
        """The body bytes received since the last take."""
        chunk = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body.clear()
        self.taken = self.received
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self._reset()
        self.transport.write(data)

    def abort(self) -> None:
        """Close at once (the upstream sees its request cancelled)."""
        self.closed = self.cancelled = True
        if self.transport is not None:
            self.transport.abort()
        self._fail(httpx.ReadError("the request was cancelled"))
        self._wake()

    @property
    def dropped_unanswered(self) -> bool:
        """The connection failed before any of its answer came, and not by a cancel: an idle
        connection the upstream closed as the request went out (one more try, on a new one)."""
        return self.error is not None and self.received == 0 and not self.cancelled

    @property
    def reusable(self) -> bool:
        return self.complete and not self.closed and self.error is None and self.keep_alive and not self.body


class AnswerStream(httpx.AsyncByteStream):
    """An answer's body, chunk by chunk as it arrives; the connection goes back when it ends."""

    def __init__(self, connection: UpstreamConnection, transport: UpstreamTransport) -> None:
        self.connection = connection
        self.transport = transport
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self.connection
        while True:
            if connection.body:
                yield connection.take()
            elif connection.complete:
                return
            elif connection.error is not None:
                raise connection.error
            else:
                await connection.wait()

    @property
    def ended(self) -> bool:
        """Whether the answer has all arrived and been taken (the last chunk is out)."""
        return self.connection.complete and not self.connection.body

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            self.transport.give_back(self.connection)

    def cancel(self) -> None:
        """Stop the upstream's work on this request now (the client went away)."""
        self.connection.abort()


class Reply:
    """An upstream's answer as the gateway reads it: the status, the headers as sent, and the
    body as it arrives (``stream``); ``aclose`` gives the connection back."""

    __slots__ = ("headers", "status_code", "stream")

    def __init__(self, status_code: int, headers: list[tuple[bytes, bytes]], stream: AnswerStream) -> None:
        self.status_code = status_code
        self.headers = headers
        self.stream = stream

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.stream])

    async def aclose(self) -> None:
        await self.stream.aclose()


class Cancel:
    """Cancels one upstream request from outside (the client went away), whatever stage it is at.

    Passed to the transport as the request extension ``"slotserve.cancel"``.
    """

    def __init__(self) -> None:
        self.fired = False
        self._connection: UpstreamConnection | None = None

    def attach(self, connection: UpstreamConnection) -> None:
        self._connection = connection
        if self.fired:
            connection.abort()

    def fire(self) -> None:
        self.fired = True
        if self._connection is not None:
            self._connection.abort()


class Upstreams(Protocol):
    """What hands out one pool of connections per upstream process (the application does): the
    stages that send take it, never the application itself."""

    def upstream_for(self, upstream: str) -> UpstreamTransport: ...


class UpstreamTransport(httpx.AsyncBaseTransport):
    """The keep-alive connections to one upstream process (``http://host:port``)."""

    KEEP = 256

    def __init__(self, upstream: str, *, connect_timeout: float = 5.0) -> None:
        url = httpx.URL(upstream)
        if not url.host or not url.port:
            raise ValueError(f"an upstream is http://host:port, not {upstream!r}")
        self.host, self.port = url.host, url.port
        self.connect_timeout = connect_timeout
        self.idle: list[UpstreamConnection] = []
        self._host_header = url.netloc
        self._base = url
        self._urls: dict[str, httpx.URL] = {}

    def url(self, path: str) -> httpx.URL:
        """The URL of ``path`` on this upstream (parsed once)."""
        found = self._urls.get(path)
        if found is None:
            if len(self._urls) >= 256:  # callers choose paths under /channels/<name>/: keep it bounded
                self._urls.clear()
            found = self._urls[path] = self._base.join(path)
        return found

    async def connect(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(UpstreamConnection, self.host, self.port)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(
                f"no connection to {self.host}:{self.port} within {self.connect_timeout:g} s"
            ) from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return connection

    def idle_connection(self) -> UpstreamConnection | None:
        while self.idle:
            connection = self.idle.pop()
            if not connection.closed:
                return connection
        return None

    def give_back(self, connection: UpstreamConnection) -> None:
        if connection.reusable and len(self.idle) < self.KEEP:
            self.idle.append(connection)
        elif not connection.closed:
            connection.abort()

    def target(self, path: str) -> bytes:
        """The request target of ``path`` on this upstream, quoted as httpx would (kept)."""
        return self.url(path).raw_path

    async def send(
        self,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        content: bytes,
        cancel: Cancel | None = None,
    ) -> Reply:
        """The gateway's own call: one request (``headers`` without host and length), its
        answer's head awaited, its body to be read from ``Reply.stream``."""
        connection = await self._answered(self.request_bytes(method, target, headers, content), cancel)
        return Reply(connection.status, connection.headers, AnswerStream(connection, self))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        content = request.content  # the gateway sends bytes it already holds
        headers = [(n, v) for n, v in request.headers.raw if n.lower() not in (b"host", b"content-length")]
        data = self.request_bytes(request.method.encode(), request.url.raw_path, headers, content)
        connection = await self._answered(data, request.extensions.get("slotserve.cancel"))
        return httpx.Response(
            connection.status,
            headers=connection.headers,
            stream=AnswerStream(connection, self),
            extensions={"http_version": b"HTTP/1.1"},
            request=request,
        )

    def request_bytes(
        self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], content: bytes
    ) -> bytes:
        """A request as it goes on the wire: ``headers`` without host and length (added here)."""
        lines = [b"%s %s HTTP/1.1\r\nhost: %s\r\n" % (method, target, self._host_header)]
        for name, value in headers:
            lines.append(b"%s: %s\r\n" % (name, value))
        lines.append(b"content-length: %d\r\n\r\n" % len(content))
        lines.append(content)
        return b"".join(lines)

    async def _answered(self, data: bytes, cancel: Cancel | None) -> UpstreamConnection:
        """Send a request on an idle connection (or a new one) and wait for its answer's head."""
        connection = self.idle_connection()
        if connection is not None:
            await self._exchange(connection, data, cancel)
            if connection.dropped_unanswered:
                # The upstream closed this idle connection as we sent on it: once more, on a new one.
                connection = None
        if connection is None:
            connection = await self.connect()
            await self._exchange(connection, data, cancel)
        if connection.error is not None:
            error = connection.error
            connection.abort()
            raise error
        return connection

    @staticmethod
    async def _exchange(connection: UpstreamConnection, data: bytes, cancel: Cancel | None) -> None:
        """Send the request and wait for the answer's head."""
        connection.send(data)
        if cancel is not None:
            cancel.attach(connection)
        try:
            while not connection.head_done and connection.error is None:
                await connection.wait()
        except asyncio.CancelledError:
            connection.abort()
            raise

    async def aclose(self) -> None:
        while self.idle:
            self.idle.pop().abort()


def client_for(upstream: str) -> httpx.AsyncClient:
    """An httpx client for ``http://host:port`` over its own pool of connections."""
    return httpx.AsyncClient(
        base_url=upstream,
        transport=UpstreamTransport(upstream),
        headers={"accept-encoding": "identity"},  # the body is read for usage: no compression
    )
