"""The gateway's own HTTP/1.1 server, in front of uvicorn's.

    uvicorn slotserve_site.asgi:application --http gateway.serve.server:GatewayHttp

(what the Dockerfile and Compose run, and each web process of ``./slotserve start``:
slotserve_site.running.web). Each connection's requests to
the gateway's paths (``gateway.serve.handoff.judge``) are parsed here by llhttp
(``httptools``, the parser uvicorn uses) and given to the gateway's ASGI application directly;
at its first request to any other path the connection, with that request's bytes, goes to
uvicorn's own httptools protocol for the rest of its life: the portal, the REST API and the
WebSockets are served exactly as before, on the same port.

Why a server of its own: uvicorn writes every ASGI message to the socket as it comes, so a
streamed answer's head, each chunk and its end are separate writes, and each write to a local
socket is a system call that wakes the reader: the largest part of what a proxy costs. Here an
answer's head waits for its first body bytes and the end rides with the last chunk, so a
streamed answer leaves in as many writes as its chunks came from the process
(``bench/gateway_bench.py`` measures it against a byte relay).

A ``POST``, once its body is in (up to the gateway's limit), is first offered to the fast lane
(``gateway.serve.fast_lane``), which carries a request that can go upstream at once in callbacks, with no
task; whatever the lane declines, and every other gateway request, is answered by the gateway's
ASGI application in a task of its own.

What it leaves to uvicorn: a request it cannot judge at its first bytes (a target that is not a
path, an ``Upgrade`` header, a head larger than ``handoff.MAX_HEAD``). Requests pipelined behind a
gateway request are read here and answered in order: the gateway's by the gateway, any other by
the whole site's application (as uvicorn would call it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import httptools

from gateway.admit.refusals import error_body
from gateway.admit.request import flavour_of, is_gateway_path
from gateway.serve import fast_lane
from gateway.serve.handoff import find_gateway, judge
from gateway.serve.http_cycle import STATUS_LINES, Cycle
from gateway.stream.relay import ON_DISCONNECT
from slotserve_base.vocabulary import ErrorCode

log = logging.getLogger(__name__)

# Reading pauses while this much of the next pipelined requests waits for an answer to end.
WAITING_HIGH_WATER = 64 * 1024


class GatewayHttp(asyncio.Protocol):
    """One client connection: gateway requests served here, the rest handed to uvicorn."""

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.config = config
        self.server_state = server_state
        self.app_state = app_state
        self.loop = _loop or asyncio.get_event_loop()
        self.gateway = find_gateway(config.loaded_app)
        # The fast lane (gateway.serve.fast_lane) carries what it can.
        self.fast_lane = self.gateway is not None and self.gateway.lane
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.start: bytes = b""  # the bytes of a request whose head is not all there yet
        self.cycle: Cycle | None = None  # the request being answered
        self.queued: deque[Cycle] = deque()  # pipelined requests, read while one is answered
        self.waiting: list[bytes] = []  # bytes after a request, until its answer ends
        self.waiting_size = 0
        self.reading: Cycle | None = None  # the request whose head or body is being read
        self.in_message = False  # llhttp has begun a request and not ended it
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive_timer: asyncio.TimerHandle | None = None
        self.writing_paused = False
        self.drained: asyncio.Future[None] | None = None
        self.on_drained: Callable[[], None] | None = None  # a lane exchange waiting to read on
        self.closing = False
        # A request that may go to the fast lane (``gateway.serve.fast_lane``) once its body is in.
        self.lane_candidate: Cycle | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server_state.connections.add(self)
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        self._stop_keep_alive_timer()
        for cycle in (self.cycle, self.reading, *self.queued):
            if cycle is not None:
                cycle.gone()
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def data_received(self, data: bytes) -> None:
        self._stop_keep_alive_timer()
        if self.in_message:  # the rest of a request llhttp has begun: it goes on where it stopped
            self._feed(data)
            return
        if self.cycle is not None:
            # A next request while one is answered: read once the answer has ended.
            self.waiting.append(data)
            self.waiting_size += len(data)
            if self.waiting_size > WAITING_HIGH_WATER:
                self.transport.pause_reading()
            return
        data, self.start = self.start + data, b""  # the start of a request: whose is it?
        verdict = judge(data) if self.gateway is not None else False
        if verdict is None:
            self.start = data
        elif verdict:
            self._feed(data)
        else:
            self._hand_off(data)

    def _feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # judged without an Upgrade header: nothing here upgrades
        except httptools.HttpParserError as exc:
            self._refuse_unreadable(str(exc))

    def eof_received(self) -> None:
        pass

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        if self.on_drained is not None:
            on_drained, self.on_drained = self.on_drained, None
            on_drained()

    async def drain(self) -> None:
        if self.writing_paused and not self.transport.is_closing():
            self.drained = self.loop.create_future()
            await self.drained

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close now if idle, else after the answer under way."""
        if self.cycle is None and not self.in_message:
            self.transport.close()
        else:
            self.closing = True

    # llhttp's callbacks

    def on_message_begin(self) -> None:
        self.in_message = True
        self.url = b""
        self.headers = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        parsed = httptools.parse_url(self.url)
        raw_path = parsed.path
        path = unquote(raw_path.decode("ascii"))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": self.parser.get_http_version(),
            "server": self.server,
            "client": self.client,
            "scheme": "http",
            "method": self.parser.get_method().decode("ascii"),
            "root_path": "",
            "path": path,
            "raw_path": raw_path,
            "query_string": parsed.query or b"",
            "headers": self.headers,
            "state": self.app_state.copy(),
        }
        cycle = Cycle(self, scope, self.parser.should_keep_alive() and not self.closing)
        limit = self.config.limit_concurrency
        state = self.server_state
        if limit is not None and (len(state.connections) >= limit or len(state.tasks) >= limit):
            # uvicorn's --limit-concurrency, as uvicorn applies it to the requests it reads.
            log.warning("Exceeded concurrency limit.")
            cycle.keep_alive = False
            cycle.app = over_concurrency_limit
        elif not is_gateway_path(path):
            # A request pipelined behind a gateway request (the first of a connection is judged
            # before it is read): the whole site's application answers it, in turn.
            cycle.app = self.config.loaded_app
        scope["extensions"] = {ON_DISCONNECT: cycle.on_disconnect}
        self.reading = cycle
        if self.cycle is not None:
            self.queued.append(cycle)
        elif self.fast_lane and cycle.app is None and scope["method"] == "POST" and not cycle.expect_continue:
            self.cycle = self.lane_candidate = cycle  # offered to the lane once its body is in
        else:
            self._start(cycle)

    def on_body(self, body: bytes) -> None:
        cycle = self.reading
        assert cycle is not None
        cycle.body.append(body)
        cycle.wake()
        if cycle is self.lane_candidate:
            cycle.body_size += len(body)
            assert self.gateway is not None
            if cycle.body_size > self.gateway.max_body:  # past the limit: the application refuses it
                self.lane_candidate = None
                self._run(cycle)

    def on_message_complete(self) -> None:
        cycle = self.reading
        assert cycle is not None
        cycle.body_done = True
        cycle.wake()
        self.reading = None
        self.in_message = False
        if cycle is self.lane_candidate:
            self.lane_candidate = None
            assert self.gateway is not None
            body = cycle.body[0] if len(cycle.body) == 1 else b"".join(cycle.body)
            try:
                taken = fast_lane.take(self.gateway, cycle, body)
            except Exception:  # the lane's fault: the application answers instead
                log.exception("gateway: the fast lane failed to take a request")
                taken = False
            if taken:
                cycle.body.clear()
                cycle.body_given = True
            else:
                self._run(cycle)

    # The requests

    def _start(self, cycle: Cycle) -> None:
        self.cycle = cycle
        self._run(cycle)

    def _run(self, cycle: Cycle) -> None:
        """The application answers ``cycle``, in a task of its own."""
        assert self.gateway is not None
        task = self.loop.create_task(cycle.run(cycle.app or self.gateway))
        tasks = self.server_state.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def answered(self, cycle: Cycle) -> None:
        """``cycle``'s answer has gone out: the connection takes the next request, or closes."""
        self.server_state.total_requests += 1
        if not cycle.keep_alive or not cycle.body_done or self.closing or self.transport.is_closing():
            self.transport.close()
            return
        self.cycle = None
        if self.queued:
            self._start(self.queued.popleft())
            return
        if self.waiting:
            data = b"".join(self.waiting)
            self.waiting.clear()
            self.waiting_size = 0
            self.transport.resume_reading()
            self.loop.call_soon(self._next, data)
        else:
            self.keep_alive_timer = self.loop.call_later(self.config.timeout_keep_alive, self._idle)

    def _next(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.data_received(data)

    def _idle(self) -> None:
        self.keep_alive_timer = None
        if self.cycle is None and not self.in_message:
            self.transport.close()

    def _stop_keep_alive_timer(self) -> None:
        if self.keep_alive_timer is not None:
            self.keep_alive_timer.cancel()
            self.keep_alive_timer = None

    def _hand_off(self, data: bytes) -> None:
        """The rest of this connection is uvicorn's, starting with ``data``."""
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        self.server_state.connections.discard(self)
        self._stop_keep_alive_timer()
        inner = HttpToolsProtocol(
            config=self.config, server_state=self.server_state, app_state=self.app_state, _loop=self.loop
        )
        self.transport.set_protocol(inner)
        inner.connection_made(self.transport)
        if self.writing_paused:
            inner.pause_writing()
        inner.data_received(data)

    def _refuse_unreadable(self, problem: str) -> None:
        """A 400 for bytes that are not HTTP (unless an answer has begun), and the end."""
        cycle = self.reading or self.cycle
        if cycle is not None:
            cycle.gone()
        if cycle is None or not cycle.started:
            body = f"Invalid HTTP request received: {problem}".encode()
            self.transport.write(
                STATUS_LINES[400]
                + b"content-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
                + b"content-length: %d\r\n\r\n" % len(body)
                + body
            )
        self.transport.close()


async def over_concurrency_limit(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The answer past ``--limit-concurrency``: a 503 in the caller's API's shape."""
    body = error_body(
        503,
        ErrorCode.SERVICE_UNAVAILABLE,
        "the gateway is at its concurrency limit (uvicorn --limit-concurrency); try again in a moment",
        flavour_of(scope["path"]),
    )
    headers = [
        (b"content-type", b"application/json"),
        (b"retry-after", b"1"),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _address(address: Any) -> tuple[str, int] | None:
    with contextlib.suppress(TypeError, ValueError):
        host, port = address[0], address[1]
        return str(host), int(port)
    return None
