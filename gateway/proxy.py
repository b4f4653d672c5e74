"""The OpenAI-compatible gateway: a small ASGI application in front of the channels.

``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, ``/v1/models``,
and the same under ``/channels/<name>/v1/…``. Requests pass through unchanged
but for ``model``, mapped to the channel's alias; streams are forwarded chunk
by chunk as they arrive. Decisions are ``gateway.access``; this module only
reads, forwards and counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx
from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone
from redis.exceptions import RedisError

from channels_app.vocabulary import ErrorCode, Phase
from gateway.access import ChannelView, Refusal, admit, models_for, route
from gateway.body import BodyTooLarge, parse_body
from gateway.counters import Counters
from gateway.events import Events, Usage
from gateway.snapshot import Caller, Snapshot, SnapshotCache
from gateway.upstream import Cancel, UpstreamTransport

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

PROXIED = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}
HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"content-length",
    b"te",
    b"trailer",
    b"upgrade",
}
# Seconds a client waits before trying again when Redis or the database is unreachable.
UNAVAILABLE_RETRY_AFTER = 5


def error_body(status: int, code: str, message: str) -> bytes:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


async def respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def refuse(send: Send, refusal: Refusal) -> None:
    headers = [(b"retry-after", str(refusal.retry_after).encode())] if refusal.retry_after is not None else []
    await respond(send, refusal.status, error_body(refusal.status, refusal.code, refusal.message), headers)


def authenticate(scope: Scope, snapshot: Snapshot) -> Caller | None:
    """The caller whose API key is in the ``Authorization: Bearer`` header, if it is usable."""
    header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
    scheme, _, key = header.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return None
    return snapshot.callers.get(hashlib.sha256(key.strip().encode()).hexdigest())


def split_path(path: str) -> tuple[str | None, str]:
    """``/channels/a100-0/v1/models`` → (``a100-0``, ``/v1/models``)."""
    if path.startswith("/channels/"):
        name, _, rest = path[len("/channels/") :].partition("/")
        return name, "/" + rest
    return None, path


class Answer:
    """Watches what is sent to the client: the status, and when the first body bytes went out."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = time.perf_counter()
        self.status: int | None = None
        self.first_byte: float | None = None
        self.counted = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif self.first_byte is None and message.get("body"):
            self.first_byte = time.perf_counter()
        await self._send(message)

    @property
    def ttft_seconds(self) -> float | None:
        return None if self.first_byte is None else self.first_byte - self.started


class Gateway:
    def __init__(self) -> None:
        self.snapshots = SnapshotCache(settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS)
        self.counters = Counters(settings.REDIS_URL)
        self.upstreams: dict[str, UpstreamTransport] = {}
        self.max_body = settings.SLOTSERVE_GATEWAY_MAX_BODY_BYTES

    def upstream_for(self, upstream: str) -> UpstreamTransport:
        """One pool of connections per upstream process."""
        transport = self.upstreams.get(upstream)
        if transport is None:
            transport = self.upstreams[upstream] = UpstreamTransport(upstream)
        return transport

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = Answer(send)
        try:
            await self.handle(scope, receive, answer.send, answer)
        except (RedisError, DatabaseError) as exc:
            # Which channel may take the request, and who is in flight, cannot be known now.
            what = "Redis" if isinstance(exc, RedisError) else "the database"
            log.warning("gateway: %s is unreachable: %r", what, exc)
            if answer.status is None:
                message = f"SlotServe cannot reach {what} right now; try again in a few seconds"
                await respond(
                    answer.send,
                    503,
                    error_body(503, ErrorCode.SERVICE_UNAVAILABLE, message),
                    [(b"retry-after", str(UNAVAILABLE_RETRY_AFTER).encode())],
                )
            return
        if not answer.counted and answer.status is not None:
            with contextlib.suppress(RedisError):  # a count for /metrics is not worth an error
                await self.counters.answered(answer.status)

    async def handle(self, scope: Scope, receive: Receive, send: Send, answer: Answer) -> None:
        pinned, path = split_path(scope["path"])
        method = scope["method"]
        snapshot = await self.snapshots.get()  # one view of keys and channels for the whole request
        caller = authenticate(scope, snapshot)
        if caller is None:
            await respond(
                send,
                401,
                error_body(
                    401,
                    ErrorCode.INVALID_API_KEY,
                    "a valid API key is needed: Authorization: Bearer <key> (create one in the portal)",
                ),
            )
            return
        if path == "/v1/models" and method == "GET":
            await self.models(send, snapshot, caller, pinned)
        elif path in PROXIED and method == "POST":
            await self.proxy(receive, send, snapshot, caller, pinned, path, answer)
        else:
            await respond(
                send, 404, error_body(404, ErrorCode.NOT_FOUND, f"no endpoint {method} {scope['path']}")
            )

    async def models(self, send: Send, snapshot: Snapshot, caller: Caller, pinned: str | None) -> None:
        channels = [c for c in snapshot.channels if pinned is None or c.name == pinned]
        switching = await self.counters.switching(c.id for c in channels)
        views = [_with_switching(c, c.id in switching) for c in channels]
        pairs = models_for(caller_id=caller.user_id, channels=views, now=timezone.now())
        data = [
            {"id": model, "object": "model", "owned_by": "slotserve", "channel": name}
            for model, name in pairs
        ]
        await respond(send, 200, json.dumps({"object": "list", "data": data}).encode())

    async def read_body(self, receive: Receive) -> bytes | None:
        """The whole body; None when the client left; ``BodyTooLarge`` past the limit."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body:
                raise BodyTooLarge
            chunks.append(body)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def proxy(
        self,
        receive: Receive,
        send: Send,
        snapshot: Snapshot,
        caller: Caller,
        pinned: str | None,
        path: str,
        answer: Answer,
    ) -> None:
        try:
            raw = await self.read_body(receive)
        except BodyTooLarge:
            message = f"the request body is larger than {self.max_body} bytes"
            await respond(send, 413, error_body(413, ErrorCode.REQUEST_TOO_LARGE, message))
            return
        if raw is None:
            return
        body, problem = parse_body(raw)
        if body is None:
            await respond(send, 400, error_body(400, ErrorCode.INVALID_REQUEST, problem))
            return
        now = timezone.now()
        model = body.get("model")
        candidates = [c for c in snapshot.channels if c.model == model and c.phase == Phase.READY]
        in_flight = await self.counters.in_flight(c.id for c in candidates) if len(candidates) > 1 else {}
        chosen = route(
            caller_id=caller.user_id,
            model=model,
            pinned=pinned,
            channels=snapshot.channels,
            in_flight=in_flight,
            now=now,
        )
        if chosen.refusal is not None or chosen.channel is None:
            await refuse(
                send, chosen.refusal or Refusal(404, ErrorCode.MODEL_NOT_LOADED, "no channel serves this")
            )
            return
        channel = chosen.channel
        request_id = await self.counters.enter(channel.id)
        if request_id is None:
            refusal = admit(caller_id=caller.user_id, channel=_with_switching(channel, True), now=now)
            await refuse(
                send, refusal or Refusal(503, ErrorCode.MODEL_SWITCHING, "the channel is switching", 1)
            )
            return
        usage = Usage()
        try:
            await self.forward(receive, send, channel, path, body, usage)
        finally:
            answer.counted = True
            try:
                await self.counters.leave(
                    channel.id,
                    request_id,
                    user_id=caller.user_id,
                    key_id=caller.key_id,
                    reservation_id=channel.booking.reservation_id if channel.booking else None,
                    prompt=usage.prompt,
                    completion=usage.completion,
                    status=answer.status,
                    ttft_seconds=answer.ttft_seconds,
                )
            except RedisError:
                # The answer went out; its in-flight entry expires by itself (gateway.counters).
                log.warning("gateway: could not count request %s out of channel %s", request_id, channel.id)

    async def forward(
        self,
        receive: Receive,
        send: Send,
        channel: ChannelView,
        path: str,
        body: dict[str, Any],
        usage: Usage,
    ) -> None:
        assert channel.upstream is not None and channel.model is not None
        body["model"] = channel.model
        streaming = body.get("stream") is True
        strip_usage = False
        if streaming and path != "/v1/embeddings":
            options = body.get("stream_options")
            if not (isinstance(options, dict) and options.get("include_usage")):
                # Ask for usage to count tokens, and hide the extra chunk from a client that did not.
                body["stream_options"] = {
                    **(options if isinstance(options, dict) else {}),
                    "include_usage": True,
                }
                strip_usage = True
        upstream = self.upstream_for(channel.upstream)
        cancel = Cancel()
        request = httpx.Request(
            "POST",
            upstream.url(path),
            content=json.dumps(body).encode(),
            # The run's secret: the process answers nobody who does not have it (docs/security.md).
            headers={"content-type": "application/json", "authorization": f"Bearer {channel.upstream_key}"},
            extensions={"slotserve.cancel": cancel},
        )
        # A client that goes away cancels the upstream's work at once, whatever stage it is at.
        watcher = asyncio.ensure_future(_watch_disconnect(receive, cancel))
        try:
            try:
                response = await upstream.handle_async_request(request)
            except httpx.HTTPError as exc:
                if not cancel.fired:
                    message = f"channel {channel.name}'s process did not answer: {exc!r}"
                    await respond(send, 502, error_body(502, ErrorCode.UPSTREAM_UNREACHABLE, message))
                return
            try:
                await self.relay(send, response, streaming, strip_usage, usage, channel, cancel, watcher)
            finally:
                await response.aclose()
        finally:
            watcher.cancel()

    async def relay(
        self,
        send: Send,
        response: httpx.Response,
        streaming: bool,
        strip_usage: bool,
        usage: Usage,
        channel: ChannelView,
        cancel: Cancel,
        watcher: asyncio.Future[None],
    ) -> None:
        """Send the upstream's answer to the client as it arrives."""
        headers, event_stream = [], False
        for name, value in response.headers.raw:
            lowered = name.lower()
            if lowered == b"content-type":
                event_stream = value.startswith(b"text/event-stream")
            if lowered not in HOP_BY_HOP:
                headers.append((name, value))
        if not streaming:
            try:
                content = await response.aread()
            except httpx.HTTPError as exc:
                if not cancel.fired:
                    message = f"channel {channel.name}'s process broke off its answer: {exc!r}"
                    await respond(send, 502, error_body(502, ErrorCode.UPSTREAM_FAILED, message))
                return
            with contextlib.suppress(ValueError):
                usage.add(json.loads(content))
            headers.append((b"content-length", str(len(content)).encode()))
            watcher.cancel()
            await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
            await send({"type": "http.response.body", "body": content})
            return
        headers.append((b"x-accel-buffering", b"no"))
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        events = Events(usage, strip_usage) if response.status_code == 200 and event_stream else None
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        try:
            async for chunk in stream:  # as the transport receives it, without httpx's wrappers
                if events is not None:
                    chunk = events.feed(chunk)
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as exc:
            if cancel.fired:
                return
            # The process died mid-stream: end the stream with an error event the client can read.
            event = {
                "error": {
                    "message": f"channel {channel.name}'s process ended the stream: {exc!r}",
                    "type": "server_error",
                    "code": ErrorCode.UPSTREAM_FAILED,
                }
            }
            tail = (events.flush() if events is not None else b"") + b"data: " + json.dumps(event).encode()
            watcher.cancel()
            await send({"type": "http.response.body", "body": tail + b"\n\n"})
            return
        watcher.cancel()
        await send({"type": "http.response.body", "body": events.flush() if events is not None else b""})


def _with_switching(channel: ChannelView, switching: bool) -> ChannelView:
    from dataclasses import replace

    return replace(channel, switching=switching) if switching != channel.switching else channel


async def _watch_disconnect(receive: Receive, cancel: Cancel) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel.fire()
            return
