"""One request in the fast lane (``gateway.serve.fast_lane``), from its count in to its count
out: each step a callback of the client's connection, of the upstream connection or of Redis'
reply, answered as the ASGI application answers (the same refusals, stream, usage and record).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx
from redis.exceptions import RedisError

from gateway.admit.refusals import (
    broke_off,
    did_not_answer,
    event_of,
    process_failed_event,
    refusal_answer,
    unreachable,
)
from gateway.admit.request import flavour_of
from gateway.rules.access import ChannelView, Refusal
from gateway.rules.body import loads
from gateway.rules.callers import Caller
from gateway.stream.answer import Answer
from gateway.stream.events import Events, Usage
from gateway.stream.outgoing import passed_on
from gateway.stream.tenancy import Flight
from gateway.wire.counter_scripts import OverLimit
from gateway.wire.upstream import UpstreamConnection, UpstreamTransport

if TYPE_CHECKING:
    from gateway.serve.http_cycle import Cycle
    from gateway.serve.proxy import Gateway

log = logging.getLogger(__name__)


class Exchange:
    """One request in the lane, from its count in to its count out; each step is a callback."""

    def __init__(
        self,
        gateway: Gateway,
        cycle: Cycle,
        upstream: UpstreamTransport,
        channel: ChannelView,
        caller: Caller,
        answer: Answer,
        streaming: bool,
        strip_usage: bool,
        usage: Usage,
    ) -> None:
        self.gateway = gateway
        self.cycle = cycle
        self.protocol = cycle.protocol
        self.upstream = upstream
        self.channel = channel
        self.caller = caller
        self.answer = answer
        self.streaming = streaming
        self.strip_usage = strip_usage
        self.flavour = flavour_of(answer.path)
        self.usage = usage
        self.events: Events | None = None
        self.parts: list[bytes] = []  # an answer that is not streamed, as it arrives
        self.why: Callable[[OverLimit | None], Refusal] | None = None
        self.connection: UpstreamConnection | None = None
        self.connect_error: httpx.HTTPError | None = None  # no connection to the process
        self.request = b""  # the request as it goes to the process
        self.counted: bool | None = None  # None until Redis has answered the count in
        self.request_id: str | None = None
        self.begun = False  # the answer's head is given to the client's connection
        self.ended = False
        self.retried = False
        self.paused = False  # reading from the process waits for the client to take its bytes
        self.flight: Flight | None = None
        cycle.on_disconnect(self.client_left)

    # The callbacks

    def send(self, connection: UpstreamConnection) -> None:
        self.connection, self.answer.connected = connection, time.perf_counter()
        connection.listener = self.progress
        connection.send(self.request)

    def connect(self) -> None:
        """A new connection to the process (a task: connecting is not on the hot path)."""
        self.connection = None
        connecting = asyncio.ensure_future(self.upstream.connect())
        connecting.add_done_callback(self._connected)

    def entered(self, entering: asyncio.Future[str | None]) -> None:
        """Redis' answer to the count in: the process's answer goes on, or the request is refused."""
        over = None
        try:
            self.request_id = entering.result()
        except OverLimit as exc:
            over = exc
        except (RedisError, OSError) as exc:
            log.warning("gateway: Redis is unreachable: %r", exc)
            self.counted = False
            self._stop_upstream()
            self._answer_whole(*self._refusal(unreachable("Redis")))
            return
        except BaseException:
            self.counted = False
            self._broke()
            raise
        self.counted = self.request_id is not None
        if self.flight is not None:
            self.flight.request_id = self.request_id
        if self.ended:  # the client left meanwhile
            if self.counted:
                self._count_out()
            return
        if not self.counted:
            # The gate closed or a limit was met since the snapshot: the process's answer is dropped.
            self._stop_upstream()
            assert self.why is not None
            self._answer_whole(*self._refusal(self.why(over)))
            return
        self.progress()

    def progress(self) -> None:
        """More of the process's answer, its end, or its failure."""
        if self.ended or not self.counted:
            return
        try:
            self._relay()
        except Exception:
            log.exception("gateway: a request in the fast lane failed")
            self._broke()

    def client_left(self) -> None:
        """The client went away before its answer ended: the process's work is cancelled."""
        if self.ended:
            return
        self.ended = True
        self._landed()
        self._stop_upstream()
        if self.counted:
            self._count_out()

    def cut(self, why: Refusal) -> None:
        """Ended at a slot's edge or by the booker's request (``gateway.stream.tenancy``): the
        process's work is cancelled and the client told ``why``, as the answer's whole or as its
        stream's last event; what it was sent is counted, not what it asked for."""
        if self.ended:
            return
        self.usage.asked = 0
        self._stop_upstream()
        self.connection = None
        if not self.begun:
            self._answer_whole(*self._refusal(why))
            return
        self.answer.refused(why, self.channel.id)
        tail = self.events.flush() if self.events is not None else b""
        self._write(tail + event_of(why, self.flavour), more=False)
        self._end()

    def resume(self) -> None:
        """The client took what it was sent: read on from the process."""
        self.paused = False
        connection = self.connection
        if connection is not None and connection.transport is not None and not self.ended:
            connection.transport.resume_reading()

    # The steps

    def _relay(self) -> None:
        connection = self.connection
        if connection is None:
            if self.connect_error is not None:
                self._answer_whole(*self._refusal(did_not_answer(self.channel, self.connect_error)))
            return
        if not self.begun:
            if not connection.head_done:
                if connection.error is not None:
                    self._unanswered(connection)
                return
            headers, event_stream = passed_on(connection.headers)
            status = connection.status
            if not self.streaming and not event_stream:
                if connection.error is not None:
                    self._answer_whole(*self._refusal(broke_off(self.channel, connection.error)))
                    return
                if connection.body:  # taken as it comes, so that reading from the process goes on
                    self.parts.append(connection.take())
                if not connection.complete:
                    return
                content = b"".join(self.parts)
                with contextlib.suppress(ValueError):
                    self.usage.add(loads(content))
                headers.append((b"content-length", str(len(content)).encode()))
                self._answer_whole(status, headers, content)
                return
            headers.append((b"x-accel-buffering", b"no"))
            self.answer.status = status
            self.cycle.begin(status, headers)
            self.begun = True
            if status == 200 and event_stream:
                self.events = Events(self.usage, self.strip_usage)
        events = self.events
        chunk = connection.take() if connection.body else b""
        if events is not None and chunk:
            chunk = events.feed(chunk)
        if connection.complete:
            self._write(chunk + (events.flush() if events is not None else b""), more=False)
            self._end()
        elif connection.error is not None:
            # The process died mid-stream: the stream ends with an error event the client can read.
            tail = events.flush() if events is not None else b""
            self._write(chunk + tail + process_failed_event(self.channel, connection.error), more=False)
            self._end()
        elif chunk:
            self._write(chunk, more=True)
            if self.protocol.writing_paused and not self.paused and connection.transport is not None:
                self.paused = True
                connection.transport.pause_reading()
                self.protocol.on_drained = self.resume

    def _unanswered(self, connection: UpstreamConnection) -> None:
        """The process's connection failed before the answer's head."""
        if connection.dropped_unanswered and not self.retried:
            # The process closed this idle connection as the request went out: once more, anew.
            self.retried = True
            connection.listener = None
            self.connect()
            return
        assert connection.error is not None
        self._answer_whole(*self._refusal(did_not_answer(self.channel, connection.error)))

    def _connected(self, connecting: asyncio.Future[UpstreamConnection]) -> None:
        if connecting.cancelled():
            return
        error = connecting.exception()
        if self.ended:
            if error is None:
                connecting.result().abort()
            return
        if isinstance(error, httpx.HTTPError):
            self.connect_error = error
            self.progress()  # answered once the count in is known
        elif error is not None:
            self._broke()
        else:
            self.send(connecting.result())

    def _refusal(self, refusal: Refusal) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        self.answer.refused(refusal, self.channel.id)
        body, headers = refusal_answer(refusal, self.flavour)
        return refusal.status, headers, body

    def _answer_whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """An answer in one piece: the process's (not streamed) or the gateway's own."""
        self.answer.status = status
        self.cycle.begin(status, headers)
        self._write(body, more=False)
        self._end()

    def _write(self, body: bytes, more: bool) -> None:
        if body and self.answer.first_byte is None:
            self.answer.first_byte = time.perf_counter()
        self.cycle.write(body, more)

    def _end(self) -> None:
        """The answer is out: the connection goes back to the pool and the request is counted out
        (an answer that was never counted in is counted for /metrics and the log)."""
        self.ended = True
        self._landed()
        connection = self.connection
        if connection is not None:
            connection.listener = None
            self.upstream.give_back(connection)
        if self.protocol.on_drained == self.resume:
            self.protocol.on_drained = None
        if self.counted:
            self._count_out()
        elif self.answer.status is not None:
            counting = asyncio.ensure_future(
                self.gateway.counters.answered(
                    self.answer.status, record=self.answer.record(self.gateway.counters.new_id())
                )
            )
            counting.add_done_callback(_ignore_redis_error)

    def _count_out(self) -> None:
        assert self.request_id is not None
        answer = self.answer
        self.usage.settle(answer.status)
        self.gateway.counters.leave_soon(
            self.channel.id,
            self.request_id,
            user_id=self.caller.user_id,
            key_id=self.caller.key_id,
            reservation_id=answer.used_booking,
            prompt=self.usage.prompt,
            completion=self.usage.completion,
            status=answer.status,
            ttft_seconds=answer.ttft_seconds,
            record=answer.record(self.request_id, self.usage),
        )

    def _landed(self) -> None:
        if self.flight is not None:
            self.gateway.tenancy.landed(self.channel.id, self.flight)
            self.flight = None

    def _stop_upstream(self) -> None:
        """Close the process's connection: it sees the request cancelled."""
        connection = self.connection
        if connection is not None:
            connection.listener = None
            if not connection.complete:
                connection.abort()
            else:
                self.upstream.give_back(connection)

    def _broke(self) -> None:
        """Something unforeseen: the process's work stops, the client gets a 500 or a cut."""
        if not self.ended:
            self.ended = True
            self._landed()
            self._stop_upstream()
            self.cycle.abandon()
            if self.counted:
                self._count_out()


def _ignore_redis_error(counting: asyncio.Future[Any]) -> None:
    """A count for /metrics is not worth an error (as in ``Gateway.__call__``); others are logged."""
    error = None if counting.cancelled() else counting.exception()
    if error is not None and not isinstance(error, RedisError):
        log.warning("gateway: could not count an answer", exc_info=error)
