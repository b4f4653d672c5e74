"""Sending a request to its process and its answer back as it arrives: the upstream's work
cancelled at once when the client leaves or the count in refuses it, a stream passed on chunk by
chunk, a process that dies mid-stream told as an error event."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable

import httpx

from gateway.admit.admission import Entry, cancel_unless_counted, settled
from gateway.admit.refusals import (
    broke_off,
    did_not_answer,
    event_of,
    preempted,
    process_failed_event,
    refuse,
)
from gateway.rules.access import ChannelView, Refusal
from gateway.rules.body import loads
from gateway.stream.assembled import Assembly
from gateway.stream.events import Events, Usage
from gateway.stream.outgoing import Outgoing, passed_on
from gateway.types import Message, Receive, Send
from gateway.wire.upstream import Cancel, Reply, Upstreams


class Preemption:
    """A request that may be ended while it runs: a borrowed one by its booker's requests
    (docs/gateway.md, "Lending"), someone else's at a slot's first moment ("A slot's first
    second"). Its process's work is cancelled, and its caller told why instead of nothing."""

    def __init__(self, channel: ChannelView) -> None:
        self.channel = channel
        self.cancel: Cancel | None = None
        self.why: Refusal | None = None

    @property
    def ended(self) -> bool:
        return self.why is not None

    def end(self, why: Refusal | None = None) -> None:
        if self.why is not None:
            return
        self.why = why or preempted(self.channel)
        if self.cancel is not None:
            self.cancel.fire()


async def forward(
    upstreams: Upstreams,
    receive: Receive,
    send: Send,
    channel: ChannelView,
    outgoing: Outgoing,
    usage: Usage,
    entry: Entry,
    on_disconnect: Callable[[Callable[[], None] | None], None] | None = None,
    *,
    preemption: Preemption | None = None,
    assemble: bool = False,
) -> None:
    """``assemble``: the request asked for a whole answer and goes upstream as a stream, made
    whole here (``gateway.stream.assembled``)."""
    assert channel.upstream is not None and channel.model is not None
    upstream = upstreams.upstream_for(channel.upstream)
    target, headers, content, streaming, strip_usage = outgoing.to(channel, upstream)
    cancel = Cancel()
    if preemption is not None:
        preemption.cancel = cancel
    # A client that goes away cancels the upstream's work at once, whatever stage it is at;
    # so does a count in that refuses the request while it is on its way.
    stop_watching = _watching(receive, on_disconnect, cancel)
    if entry.pending is not None:
        entry.pending.add_done_callback(functools.partial(cancel_unless_counted, cancel))
    try:
        try:
            response = await upstream.send(outgoing.method.encode(), target, headers, content, cancel)
        except httpx.HTTPError as exc:
            if not await settled(entry, cancel):
                await refuse(send, entry.refused())
            elif preemption is not None and preemption.why is not None:
                await refuse(send, preemption.why)
            elif not cancel.fired:
                await refuse(send, did_not_answer(channel, exc))
            return
        if not await settled(entry, cancel):  # refused after all: the process's answer is dropped
            await response.aclose()
            await refuse(send, entry.refused())
            return
        try:
            if assemble:
                await relay_assembled(send, response, usage, channel, cancel, stop_watching, preemption)
            else:
                await relay(
                    send, response, streaming, strip_usage, usage, channel, cancel, stop_watching, preemption
                )
        finally:
            await response.aclose()
    finally:
        stop_watching()


async def relay(
    send: Send,
    response: Reply,
    streaming: bool,
    strip_usage: bool,
    usage: Usage,
    channel: ChannelView,
    cancel: Cancel,
    stop_watching: Callable[[], None],
    preemption: Preemption | None = None,
) -> None:
    """Send the upstream's answer to the client as it arrives (a borrowed answer ended by the
    booker's request ends with why)."""
    headers, event_stream = passed_on(response.headers)
    if not streaming and not event_stream:
        try:
            content = await response.aread()
        except httpx.HTTPError as exc:
            await _broken_off(send, channel, exc, cancel, preemption)
            return
        with contextlib.suppress(ValueError):
            usage.add(loads(content))
        headers.append((b"content-length", str(len(content)).encode()))
        stop_watching()
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": content})
        return
    headers.append((b"x-accel-buffering", b"no"))
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    events = Events(usage, strip_usage) if response.status_code == 200 and event_stream else None
    stream = response.stream
    last = b""  # the answer's last chunk: it leaves with the end of the stream, in one write
    try:
        async for chunk in stream:  # as the transport receives it, without httpx's wrappers
            if events is not None:
                chunk = events.feed(chunk)
            if stream.ended:
                last = chunk
            elif chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except httpx.HTTPError as exc:
        if preemption is not None and preemption.why is not None:
            stop_watching()
            tail = (events.flush() if events is not None else b"") + event_of(preemption.why)
            await send({"type": "http.response.body", "body": tail})
            return
        if cancel.fired:
            return
        # The process died mid-stream: end the stream with an error event the client can read.
        tail = (events.flush() if events is not None else b"") + process_failed_event(channel, exc)
        stop_watching()
        await send({"type": "http.response.body", "body": tail})
        return
    stop_watching()
    tail = events.flush() if events is not None else b""
    await send({"type": "http.response.body", "body": last + tail})


async def relay_assembled(
    send: Send,
    response: Reply,
    usage: Usage,
    channel: ChannelView,
    cancel: Cancel,
    stop_watching: Callable[[], None],
    preemption: Preemption | None,
) -> None:
    """A stream the caller did not ask for, sent on as the whole answer it asked for; an answer
    that is not a stream (an error) goes on as it came."""
    headers, event_stream = passed_on(response.headers)
    if not (event_stream and response.status_code == 200):
        await relay(send, response, False, False, usage, channel, cancel, stop_watching, preemption)
        return
    events, assembly = Events(usage, strip_usage=False), Assembly()
    try:
        async for chunk in response.stream:
            assembly.feed(events.feed(chunk))
        assembly.feed(events.flush() + b"\n\n")
    except httpx.HTTPError as exc:
        await _broken_off(send, channel, exc, cancel, preemption)
        return
    content = assembly.answer()
    headers = [(n, v) for n, v in headers if n.lower() != b"content-type"]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
    stop_watching()
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": content})


async def _broken_off(
    send: Send, channel: ChannelView, exc: Exception, cancel: Cancel, preemption: Preemption | None
) -> None:
    """A whole answer cut before it was read: ended (told why), cancelled (the client left:
    nothing to tell), or broken off by the process."""
    if preemption is not None and preemption.why is not None:
        await refuse(send, preemption.why)
    elif not cancel.fired:
        await refuse(send, broke_off(channel, exc))


# A server's offer in the scope's extensions (gateway.serve.server does): ``on_disconnect(callback)``
# calls ``callback`` if the client leaves before the answer ends (``None`` takes it back), so
# no task has to wait on ``receive`` for it.
ON_DISCONNECT = "slotserve.on_disconnect"


def _watching(
    receive: Receive, on_disconnect: Callable[[Callable[[], None] | None], None] | None, cancel: Cancel
) -> Callable[[], None]:
    """Cancel the upstream's work when the client goes away, until the returned function is
    called (before the answer's end is sent)."""
    if on_disconnect is not None:
        on_disconnect(cancel.fire)
        return functools.partial(on_disconnect, None)
    watcher = asyncio.ensure_future(_watch_disconnect(receive, cancel))

    def stop() -> None:
        watcher.cancel()

    return stop


async def _watch_disconnect(receive: Receive, cancel: Cancel) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel.fire()
            return


def continuing_stream(send: Send) -> Send:
    """After a held stream's comments: the process's answer goes on in the same stream. Its own
    start is dropped; an answer that is not a 200 stream becomes one error event."""
    failed: list[bytes] | None = None

    async def sending(message: Message) -> None:
        nonlocal failed
        if message["type"] == "http.response.start":
            if message["status"] != 200:
                failed = []
            return
        if failed is None:
            await send(message)
            return
        failed.append(message.get("body", b""))
        if not message.get("more_body"):
            body = b"".join(failed).strip() or b'{"error": {"message": "the process failed"}}'
            await send({"type": "http.response.body", "body": b"data: " + body + b"\n\n"})

    return sending


async def until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def adding_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return sending


def without_body(send: Send) -> Send:
    """For HEAD: the answer's status and headers (its length included), no body bytes."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.body":
            if message.get("more_body"):
                return
            message = {"type": "http.response.body", "body": b""}
        await send(message)

    return sending
