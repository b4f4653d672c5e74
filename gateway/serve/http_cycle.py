"""One request and its answer on a connection of the gateway's HTTP server (``gateway.serve.server``):
the ASGI messages its application receives and sends, written to the connection as they come,
and the fast lane's (``gateway.serve.fast_lane``) exchange, carried in callbacks."""

from __future__ import annotations

import asyncio
import http
import logging
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol


class ClientConnection(Protocol):
    """What a cycle needs of its connection (``gateway.serve.server.GatewayHttp``): to write, to
    wait while writing is paused, and to say that its answer is whole."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    writing_paused: bool
    on_drained: Callable[[], None] | None
    server_state: Any  # uvicorn's ServerState: its default headers, its request count

    async def drain(self) -> None: ...

    def answered(self, cycle: Cycle) -> None: ...


log = logging.getLogger("gateway.serve.server")

STATUS_LINES = {
    status: b"HTTP/1.1 %d %s\r\n" % (status, http.HTTPStatus(status).phrase.encode())
    for status in range(100, 600)
    if status in http.HTTPStatus._value2member_map_
}


class Cycle:
    """One request and its answer, as ASGI's ``receive`` and ``send``."""

    def __init__(self, protocol: ClientConnection, scope: dict[str, Any], keep_alive: bool) -> None:
        self.protocol = protocol
        self.scope = scope
        self.keep_alive = keep_alive
        self.head_only = scope["method"] == "HEAD"
        self.expect_continue = any(
            name == b"expect" and value.lower() == b"100-continue" for name, value in scope["headers"]
        )
        self.body: list[bytes] = []
        self.body_size = 0  # counted while the body is read for the fast lane
        self.body_done = False
        self.body_given = False
        self.disconnected = False
        self.head: bytes | None = None  # the answer's head, until its first body bytes
        self.started = False
        self.has_length = False
        self.bodiless = False
        self.chunked = False
        self.complete = False
        self.left: Callable[[], None] | None = None  # called if the client leaves (ON_DISCONNECT)
        self.app: Any = None  # the application that answers, if not the gateway
        self._waiter: asyncio.Future[None] | None = None

    def on_disconnect(self, callback: Callable[[], None] | None) -> None:
        self.left = callback

    def gone(self) -> None:
        """The client is gone (or spoke something else than HTTP): nothing more goes to it."""
        if self.disconnected:
            return
        self.disconnected = True
        self.wake()
        if self.left is not None and not self.complete:
            self.left()

    def wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def run(self, app: Any) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.error("Exception in ASGI application", exc_info=exc)
            self.abandon()
            if not isinstance(exc, Exception):
                raise
            return
        self.abandon()

    def abandon(self) -> None:
        """An application that ended without finishing its answer: a 500, or a cut connection."""
        if self.complete or self.disconnected:
            return
        transport = self.protocol.transport
        if not self.started:
            body = b"Internal Server Error"
            transport.write(
                STATUS_LINES[500]
                + b"content-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
                + b"content-length: %d\r\n\r\n" % len(body)
                + body
            )
        self.complete = True
        transport.close()

    async def receive(self) -> dict[str, Any]:
        if self.expect_continue and not self.body_done:
            self.expect_continue = False
            self.protocol.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        while True:
            if self.disconnected:
                return {"type": "http.disconnect"}
            if not self.body_given and (self.body or self.body_done):
                body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
                self.body.clear()
                self.body_given = self.body_done
                return {"type": "http.request", "body": body, "more_body": not self.body_done}
            if self.complete:
                return {"type": "http.disconnect"}
            self._waiter = self.protocol.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def send(self, message: MutableMapping[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.begin(message["status"], message.get("headers", []))
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        more = message.get("more_body", False)
        self.write(message.get("body", b""), more)
        if more and self.protocol.writing_paused:
            await self.protocol.drain()

    def begin(self, status: int, headers: Any) -> None:
        """The answer's start (it leaves with its first body bytes)."""
        if self.started:
            raise RuntimeError("the answer has started already")
        self.started = True
        self.head = self._head(status, headers)

    def write(self, body: bytes, more: bool) -> None:
        """Body bytes of the answer; the last (``more`` false) ends it. Whoever writes heeds
        ``protocol.writing_paused`` (``send`` waits for the client to take what it was sent)."""
        if self.disconnected:
            return
        if not self.started or self.complete:
            raise RuntimeError("an answer's body before its start, or after its end")
        if self.head is not None:
            head, self.head = self.head, None
            out = [self._framing(head, len(body), more)]
        else:
            out = []
        if not self.head_only and not self.bodiless:
            if self.chunked:
                if body:
                    out += (b"%x\r\n" % len(body), body, b"\r\n")
                if not more:
                    out.append(b"0\r\n\r\n")
            elif body:
                out.append(body)
        if out:
            self.protocol.transport.write(out[0] if len(out) == 1 else b"".join(out))
        if not more:
            self.complete = True
            self.wake()
            self.protocol.answered(self)

    def _head(self, status: int, headers: Any) -> bytes:
        lines = [STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status]
        self.bodiless = status in (204, 304) or status < 200  # no length, no body (RFC 9110)
        self.has_length = self.chunked = False
        for name, value in self.protocol.server_state.default_headers:
            lines.append(b"%s: %s\r\n" % (name, value))
        for name, value in headers:
            lowered = name.lower()
            if lowered == b"content-length":
                self.has_length = True
            elif lowered == b"transfer-encoding":
                self.chunked = value.lower() == b"chunked"  # framed here; other codings dropped
                continue
            elif lowered == b"content-type" and value.startswith(b"text/event-stream"):
                self.chunked = not self.has_length  # a stream stays one, however it arrives
            elif lowered == b"connection":
                if value.lower() == b"close":
                    self.keep_alive = False
                continue
            lines.append(b"%s: %s\r\n" % (name, value))
        return b"".join(lines)

    def _framing(self, head: bytes, first: int, more: bool) -> bytes:
        """The head's last lines, now that the first body part says how the body goes."""
        tail = []
        if self.bodiless:
            self.chunked = False
        elif not self.has_length and not self.chunked:
            if more:
                self.chunked = True
            else:
                tail.append(b"content-length: %d\r\n" % first)
        if self.chunked:
            tail.append(b"transfer-encoding: chunked\r\n")
        if not self.keep_alive:
            tail.append(b"connection: close\r\n")
        tail.append(b"\r\n")
        return head + b"".join(tail)
