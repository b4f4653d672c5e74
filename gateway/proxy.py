"""The OpenAI-compatible gateway: a small ASGI application in front of the channels.

Any ``POST`` under ``/v1/`` (chat, completions, embeddings, the Responses and Anthropic
Messages APIs, rerank, audio …) or to llama-server's own paths (``/tokenize``, ``/infill`` …)
whose JSON names a ``model`` is routed by that model; ``GET``/``HEAD /v1/models`` and
``/v1/models/{id}`` list what the caller may use; under ``/channels/<name>/`` every path and
method goes to that channel's process. Requests pass through unchanged but for ``model``,
mapped to the channel's alias; streams are forwarded chunk by chunk as they arrive; errors
come in the caller's API's own shape (Anthropic's on ``/v1/messages``). Decisions are
``gateway.access``; this module only reads, forwards and counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone
from redis.exceptions import RedisError

from gateway.access import ChannelView, Refusal, admit, models_for, route
from gateway.body import BodyTooLarge, dumps, loads, parse_body
from gateway.cors import CorsPolicy, is_cors_header
from gateway.counters import HELD_TTL_SECONDS, Counters, OverLimit, week_start
from gateway.events import Events, Usage
from gateway.snapshot import Caller, Limits, Snapshot, SnapshotCache
from gateway.upstream import Cancel, Reply, UpstreamTransport
from slotserve_base.vocabulary import ErrorCode, Phase

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Paths outside /v1/ that llama-server answers and the gateway routes by ``model``.
ROOT_PATHS = frozenset(
    {
        "/completion",
        "/completions",
        "/embedding",
        "/embeddings",
        "/infill",
        "/tokenize",
        "/detokenize",
        "/apply-template",
        "/rerank",
        "/reranking",
    }
)
# A process's admin endpoints (llama-server, vLLM, SGLang): through the pinned path, staff
# only. What they do reaches past the caller's own request: another caller's slot state saved
# or restored, and in shared time the previous caller's sampling settings shown (``/slots``),
# the process's settings or adapters changed, caches flushed, weights swapped, the process put
# to sleep (docs/security.md). Reading ``/props`` stays open: it changes nothing.
ADMIN_PATHS = frozenset(
    {
        "/props",
        "/lora-adapters",
        "/reset_prefix_cache",
        "/sleep",
        "/wake_up",
        "/collective_rpc",
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/load_lora_adapter",
        "/unload_lora_adapter",
        "/flush_cache",
        "/update_weights_from_disk",
        "/update_weights_from_tensor",
        "/update_weights_from_distributed",
        "/init_weights_update_group",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/start_profile",
        "/stop_profile",
        "/configure_logging",
        "/set_internal_state",
        "/abort_request",
        "/pause",
        "/resume",
    }
)


def is_admin_endpoint(method: str, path: str) -> bool:
    """Whether ``method path`` (a process's own path, after ``/channels/<name>``) is one of its
    admin endpoints: ``/slots`` whatever the method, the others but for reading."""
    if path == "/slots" or path.startswith("/slots/"):
        return True
    return method not in ("GET", "HEAD") and path.rstrip("/") in ADMIN_PATHS


# Where the gateway asks for usage in streams (to count tokens) when the caller did not: the
# OpenAI routes. llama-server's ``/completion`` and ``/completions`` are its own API, whose
# every event says the tokens so far (``gateway.events``).
USAGE_OPTION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/chat/completions"})
# Headers of the upstream's answer the gateway does not pass on: the connection's own, and
# those the gateway's server sets itself (one ``server``, one ``date``), and CORS (ours).
HOP_BY_HOP = {
    b"server",
    b"date",
    b"x-accel-buffering",
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
# Seconds a caller with as many held requests as they may waits before trying again.
HELD_RETRY_AFTER = 5


# Which API's error shape this request gets: "openai", or "anthropic" on /v1/messages.
_flavour: ContextVar[str] = ContextVar("slotserve_error_flavour", default="openai")
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def is_gateway_path(path: str) -> bool:
    """Whether the ASGI router sends ``path`` here rather than to Django."""
    return path.startswith(("/v1/", "/channels/")) or path in ROOT_PATHS


def flavour_of(path: str) -> str:
    """The API whose shape the answers to ``path`` take: Anthropic's for its Messages API."""
    return "anthropic" if "/v1/messages" in path else "openai"


def error_body(status: int, code: str, message: str, flavour: str | None = None) -> bytes:
    """An error in the caller's API's shape (``flavour``, else the request's being answered)."""
    if (flavour or _flavour.get()) == "anthropic":
        kind = ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        return json.dumps(
            {"type": "error", "error": {"type": kind, "message": message, "code": code}}
        ).encode()
    kind = OPENAI_ERROR_TYPES.get(code) or ("invalid_request_error" if status < 500 else "server_error")
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


# OpenAI's own error types for its 429s.
OPENAI_ERROR_TYPES: dict[str, str] = {
    ErrorCode.RATE_LIMIT_EXCEEDED: "requests",
    ErrorCode.INSUFFICIENT_QUOTA: "insufficient_quota",
}


def json_headers(body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> list[tuple[bytes, bytes]]:
    """The headers of a JSON answer of the gateway's own (an error, a list of models)."""
    return [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(extra or []),
    ]


async def respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": json_headers(body, headers)})
    await send({"type": "http.response.body", "body": body})


def refusal_answer(refusal: Refusal, flavour: str | None = None) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """A refusal's body (in the caller's API's shape) and headers (``Retry-After`` if it says)."""
    body = error_body(refusal.status, refusal.code, refusal.message, flavour)
    extra = [(b"retry-after", str(refusal.retry_after).encode())] if refusal.retry_after is not None else []
    return body, json_headers(body, extra)


async def refuse(send: Send, refusal: Refusal) -> None:
    body, headers = refusal_answer(refusal)
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def unreachable(what: str) -> Refusal:
    """The answer while Redis or the database (``what``) cannot be reached."""
    message = f"SlotServe cannot reach {what} right now; try again in a few seconds"
    return Refusal(503, ErrorCode.SERVICE_UNAVAILABLE, message, UNAVAILABLE_RETRY_AFTER)


def held_cap(caller: Caller) -> int:
    """How many requests ``caller`` may have held at once: ``SLOTSERVE_GATEWAY_MAX_HELD_PER_USER``,
    and no more than their own concurrency limits let run (a held request is one that would run)."""
    cap = settings.SLOTSERVE_GATEWAY_MAX_HELD_PER_USER
    limits = caller.limits
    if limits is not None:
        for limit in (limits.user_concurrent, limits.key_concurrent):
            if limit:
                cap = min(cap, limit)
    return cap


def too_many_held(caller: Caller) -> Refusal:
    cap = held_cap(caller)
    message = (
        f"you already have {cap} requests waiting for a model (X-SlotServe-Wait), as many as you may; "
        "try again when one of them is answered"
    )
    return Refusal(429, ErrorCode.TOO_MANY_HELD, message, HELD_RETRY_AFTER)


def did_not_answer(channel: ChannelView, exc: Exception) -> Refusal:
    """The answer when ``channel``'s process cannot be reached, or closes before it answers."""
    message = f"channel {channel.name}'s process did not answer: {exc!r}"
    return Refusal(502, ErrorCode.UPSTREAM_UNREACHABLE, message)


def broke_off(channel: ChannelView, exc: Exception) -> Refusal:
    """The answer when ``channel``'s process stops partway through an answer that is not streamed."""
    message = f"channel {channel.name}'s process broke off its answer: {exc!r}"
    return Refusal(502, ErrorCode.UPSTREAM_FAILED, message)


def authenticate(scope: Scope, snapshot: Snapshot) -> Caller | None:
    """The caller whose API key is in ``Authorization: Bearer <key>`` (OpenAI's clients) or in
    ``x-api-key`` (Anthropic's), if it is usable."""
    key = ""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, given = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                key = given.strip()
                break
        elif name == b"x-api-key":
            key = value.decode("latin-1").strip()
    if not key:
        return None
    return snapshot.callers.get(hashlib.sha256(key.encode()).hexdigest())


def split_path(path: str) -> tuple[str | None, str]:
    """``/channels/a100-0/v1/models`` → (``a100-0``, ``/v1/models``)."""
    if path.startswith("/channels/"):
        name, _, rest = path[len("/channels/") :].partition("/")
        return name, "/" + rest
    return None, path


class Answer:
    """Watches what is sent to the client: the status, and when the first body bytes went out."""

    def __init__(self, send: Send | None = None) -> None:
        self._send = send  # None: the gateway's server is written to directly (``gateway.fast_lane``)
        self.started = time.perf_counter()
        self.arrived = time.time()
        self.status: int | None = None
        self.first_byte: float | None = None
        self.counted = False
        # For the request log: who asked, for what, and where it went.
        self.caller: Caller | None = None
        self.method = ""
        self.path = ""
        self.model = ""  # as the client named it
        self.served = ""  # the model that served it: the channel's
        self.channel_id: int | None = None
        self.reservation_id: int | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif self.first_byte is None and message.get("body"):
            self.first_byte = time.perf_counter()
        assert self._send is not None
        await self._send(message)

    @property
    def ttft_seconds(self) -> float | None:
        return None if self.first_byte is None else self.first_byte - self.started

    def record(self, usage: Usage | None = None) -> bytes:
        """The request's log record (``gateway.requestlog``), or b"" for a caller without a key."""
        if self.caller is None or self.status is None:
            return b""
        ttft = self.ttft_seconds
        return dumps(
            [
                round(self.arrived, 3),
                self.caller.user_id,
                self.caller.key_id,
                self.channel_id,
                self.reservation_id,
                self.model[:200],
                self.method,
                self.path[:300],
                self.status,
                None if ttft is None else round(ttft * 1000, 2),
                round((time.perf_counter() - self.started) * 1000, 2),
                usage.prompt if usage else 0,
                usage.completion if usage else 0,
                self.served,
            ]
        )


class Gateway:
    # Whether the gateway's server may carry requests that can go upstream at once in its fast
    # lane (``gateway.fast_lane``), outside this application.
    lane = True

    def __init__(self) -> None:
        self.snapshots = SnapshotCache(settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS)
        self.counters = Counters(settings.REDIS_URL)
        self.upstreams: dict[str, UpstreamTransport] = {}
        self.max_body = settings.SLOTSERVE_GATEWAY_MAX_BODY_BYTES
        self.max_wait = settings.SLOTSERVE_GATEWAY_MAX_WAIT_SECONDS
        self.cors = CorsPolicy(settings.SLOTSERVE_CORS_ORIGINS)
        # What each run's process says of its model (llama-server's meta, n_ctx), asked once.
        self.meta: dict[tuple[str, str], dict[str, Any]] = {}

    def upstream_for(self, upstream: str) -> UpstreamTransport:
        """One pool of connections per upstream process."""
        transport = self.upstreams.get(upstream)
        if transport is None:
            transport = self.upstreams[upstream] = UpstreamTransport(upstream)
        return transport

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.cors.enabled:
            origin = _header(scope, b"origin")
            if origin:
                if scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method"):
                    # A browser's preflight carries no key: answered before authentication.
                    headers = self.cors.preflight_headers(
                        origin, _header(scope, b"access-control-request-headers")
                    )
                    await send({"type": "http.response.start", "status": 204, "headers": headers})
                    await send({"type": "http.response.body", "body": b""})
                    return
                if self.cors.allows(origin):
                    send = _adding_headers(send, self.cors.answer_headers(origin))
        if scope["method"] == "HEAD":  # what GET would answer, without the body
            scope = {**scope, "method": "GET"}
            send = _without_body(send)
        token = _flavour.set(flavour_of(scope["path"]))
        answer = Answer(send)
        try:
            await self.handle(scope, receive, answer.send, answer)
        except (RedisError, DatabaseError) as exc:
            # Which channel may take the request, and who is in flight, cannot be known now.
            what = "Redis" if isinstance(exc, RedisError) else "the database"
            log.warning("gateway: %s is unreachable: %r", what, exc)
            if answer.status is None:
                await refuse(answer.send, unreachable(what))
            return
        finally:
            _flavour.reset(token)
        if not answer.counted and answer.status is not None:
            with contextlib.suppress(RedisError):  # a count for /metrics is not worth an error
                await self.counters.answered(answer.status, record=answer.record())

    async def handle(self, scope: Scope, receive: Receive, send: Send, answer: Answer) -> None:
        pinned, path = split_path(scope["path"])
        method = scope["method"]
        snapshot = await self.snapshots.get()  # one view of keys and channels for the whole request
        caller = authenticate(scope, snapshot)
        answer.caller, answer.method, answer.path = caller, method, scope["path"]
        if caller is None:
            await respond(
                send,
                401,
                error_body(
                    401,
                    ErrorCode.INVALID_API_KEY,
                    "a valid API key is needed: Authorization: Bearer <key> or x-api-key: <key> "
                    "(create one in the portal)",
                ),
            )
            return
        if path == "/v1/models" and method == "GET":
            await self.models(send, snapshot, caller, pinned)
        elif path.startswith("/v1/models/") and method == "GET":
            await self.models(send, snapshot, caller, pinned, only=path[len("/v1/models/") :])
        elif pinned is not None and is_admin_endpoint(method, path) and not caller.is_staff:
            message = f"{method} {path} is an admin endpoint of channel {pinned}'s process: staff only"
            await respond(send, 403, error_body(403, ErrorCode.ADMIN_ONLY, message))
        elif pinned is not None or (method == "POST" and (path.startswith("/v1/") or path in ROOT_PATHS)):
            await self.proxy(scope, receive, send, snapshot, caller, pinned, path, answer)
        else:
            await respond(
                send, 404, error_body(404, ErrorCode.NOT_FOUND, f"no endpoint {method} {scope['path']}")
            )

    async def models(
        self, send: Send, snapshot: Snapshot, caller: Caller, pinned: str | None, only: str | None = None
    ) -> None:
        """One entry per model the caller may use now, the channels serving it listed inside."""
        channels = [c for c in snapshot.channels if pinned is None or c.name == pinned]
        switching = await self.counters.switching(c.id for c in channels)
        views = [_with_switching(c, c.id in switching) for c in channels]
        pairs = models_for(caller_id=caller.user_id, channels=views, now=timezone.now())
        serving: dict[str, list[str]] = {}
        for model, name in pairs:
            serving.setdefault(model, []).append(name)
        since = {c.model: c.since for c in views if c.model is not None}
        aliases: dict[str, list[str]] = {}
        for alias, model in sorted(snapshot.aliases.items()):
            aliases.setdefault(model, []).append(alias)
        first = {}
        for view in views:
            if view.model in serving and view.model not in first and view.upstream:
                first[view.model] = view
        metas = await asyncio.gather(*(self.model_meta(view) for view in first.values()))
        meta = dict(zip(first, metas, strict=True))
        data = [
            {
                "id": model,
                "object": "model",
                "created": int(since[model].timestamp()),
                "owned_by": "slotserve",
                "channels": names,
                "aliases": aliases.get(model, []),
                **({"meta": meta[model]} if meta.get(model) else {}),
            }
            for model, names in serving.items()
        ]
        if only is not None:
            only = snapshot.aliases.get(only, only)
        if only is None:
            await respond(send, 200, json.dumps({"object": "list", "data": data}).encode())
            return
        entry = next((d for d in data if d["id"] == only), None)
        if entry is None:
            message = f"model {only!r} is not served to you now" + (
                f"; served now: {', '.join(serving)}" if serving else ""
            )
            await respond(send, 404, error_body(404, ErrorCode.MODEL_NOT_LOADED, message))
            return
        await respond(send, 200, json.dumps(entry).encode())

    async def model_meta(self, channel: ChannelView) -> dict[str, Any]:
        """llama-server's ``meta`` of its model and its context size (``n_ctx``), asked of the
        process once per run; {} where the backend has none or does not answer within a second."""
        assert channel.upstream is not None
        found = self.meta.get((channel.upstream, channel.upstream_key))
        if found is not None:
            return found
        meta: dict[str, Any] = {}
        upstream = self.upstream_for(channel.upstream)
        headers = [(b"authorization", f"Bearer {channel.upstream_key}".encode())]
        try:
            async with asyncio.timeout(1.0):
                for path in ("/v1/models", "/props"):
                    response = await upstream.handle_async_request(
                        httpx.Request("GET", upstream.url(path), headers=headers)
                    )
                    content = await response.aread()
                    await response.aclose()
                    if response.status_code != 200:
                        continue
                    answer = json.loads(content)
                    if path == "/v1/models":
                        entries = answer.get("data") or []
                        if entries and isinstance(entries[0].get("meta"), dict):
                            meta.update(entries[0]["meta"])
                    else:
                        n_ctx = (answer.get("default_generation_settings") or {}).get("n_ctx")
                        if isinstance(n_ctx, int):
                            meta["n_ctx"] = n_ctx
        except (TimeoutError, httpx.HTTPError, ValueError, AttributeError):
            return meta  # not kept: asked again next time
        if len(self.meta) > 1024:
            self.meta.clear()
        self.meta[(channel.upstream, channel.upstream_key)] = meta
        return meta

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
        scope: Scope,
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
        content_type = _header(scope, b"content-type")
        body: dict[str, Any] | None = None
        # Routed by model: a JSON object. Pinned: JSON when it says or looks so, else any bytes.
        is_json = content_type.startswith(b"application/json") or raw.lstrip().startswith(b"{")
        if pinned is None or (is_json and raw.strip()):
            body, problem = parse_body(raw)
            if body is None:
                await respond(send, 400, error_body(400, ErrorCode.INVALID_REQUEST, problem))
                return
        wait, problem = wait_seconds(scope, caller, self.max_wait)
        if problem:
            await respond(send, 400, error_body(400, ErrorCode.INVALID_REQUEST, problem))
            return
        model = body.get("model") if body is not None else None
        answer.model = model or ""
        if model is not None:
            model = snapshot.aliases.get(model, model)  # an alias is routed as its model
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        left: asyncio.Future[None] | None = None  # while held: the client hanging up
        # A held stream gets SSE comments every HOLD_COMMENT_SECONDS, so that nothing between
        # the client and the gateway closes a quiet connection; its answer has begun then.
        held_stream = body is not None and body.get("stream") is True
        comment_at = loop.time() + HOLD_COMMENT_SECONDS
        begun = False
        held, hold_token, hold_refresh_at = False, uuid.uuid4().hex, 0.0
        try:
            while True:
                now = timezone.now()
                channel, refusal = await self.choose(snapshot, caller, model, pinned, now)
                if channel is not None:
                    limits = None if _is_booker(channel, caller) else caller.limits
                    if loop.time() >= deadline and (
                        limits is None or self.counters.may_go_ahead(caller.user_id, caller.key_id)
                    ):
                        # Nothing to wait for, and no limit to check or room under them: the
                        # request goes upstream while Redis counts it in (and checks the limits);
                        # nothing comes back before it is counted.
                        entry = Entry(
                            pending=self.counters.enter_soon(
                                channel.id, limits, user_id=caller.user_id, key_id=caller.key_id
                            ),
                            why=functools.partial(refusal_after_count_in, channel, caller, now),
                        )
                        break
                    request_id, refusal = await self.count_in(channel, caller, limits, now)
                    if refusal is None:
                        entry = Entry(request_id)
                        break
                assert refusal is not None
                if refusal.status != 503 or refusal.code not in WAITABLE or loop.time() >= deadline:
                    if begun:  # the stream has begun: the refusal is its last event
                        await send_event_error(send, refusal)
                    else:
                        await refuse(send, refusal)
                    return
                # Held, as the caller asked: look again until the model is ready or time is up,
                # within the caller's cap of held requests (counted in Redis, refreshed while held).
                if loop.time() >= hold_refresh_at:
                    if not await self.counters.hold(caller.user_id, hold_token, held_cap(caller)):
                        await refuse(send, too_many_held(caller))
                        return
                    held = True
                    hold_refresh_at = loop.time() + HELD_TTL_SECONDS / 3
                if left is None:
                    left = asyncio.ensure_future(_until_disconnect(receive))
                if held_stream and loop.time() >= comment_at:
                    if not begun:
                        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
                        begun = True
                    note = f": waiting for {model}: {refusal.message}\n\n".encode(errors="replace")
                    await send({"type": "http.response.body", "body": note, "more_body": True})
                    comment_at = loop.time() + HOLD_COMMENT_SECONDS
                done, _ = await asyncio.wait({left}, timeout=min(HOLD_POLL_SECONDS, deadline - loop.time()))
                if done:
                    return  # the client left: nothing goes upstream
                snapshot = await self.snapshots.get()
        finally:
            # The client may have left while the gateway looked again (outside the wait).
            gone = left is not None and left.done() and not left.cancelled()
            if left is not None:
                left.cancel()
            if held:
                with contextlib.suppress(RedisError):  # the entry expires by itself anyway
                    await self.counters.unhold(caller.user_id, hold_token)
        if gone:
            if channel is not None and await entry.settled():  # counted in: count it out, unsent
                assert entry.request_id is not None
                await self.counters.leave(
                    channel.id,
                    entry.request_id,
                    user_id=caller.user_id,
                    reservation_id=None,
                    prompt=0,
                    completion=0,
                )
            return  # nothing goes upstream
        if begun:
            send = _continuing_stream(send)
        assert channel is not None
        answer.channel_id, answer.served = channel.id, channel.model or ""
        answer.reservation_id = channel.booking.reservation_id if channel.booking else None
        usage = Usage.asking(body)
        outgoing = Outgoing(
            method=scope["method"],
            path=path,
            query=scope.get("query_string", b""),
            body=body,
            raw=raw,
            content_type=content_type or b"application/json",
        )
        try:
            on_disconnect = (scope.get("extensions") or {}).get(ON_DISCONNECT)
            await self.forward(receive, send, channel, outgoing, usage, entry, on_disconnect)
        finally:
            if entry.pending is not None:  # the client left before the count in was known
                with contextlib.suppress(RedisError):
                    await entry.settled()
            if entry.request_id is not None:
                answer.counted = True
                usage.settle(answer.status)
                try:
                    await self.counters.leave(
                        channel.id,
                        entry.request_id,
                        user_id=caller.user_id,
                        key_id=caller.key_id,
                        reservation_id=channel.booking.reservation_id if channel.booking else None,
                        prompt=usage.prompt,
                        completion=usage.completion,
                        status=answer.status,
                        ttft_seconds=answer.ttft_seconds,
                        record=answer.record(usage),
                    )
                except RedisError:
                    # The answer went out; its in-flight entry expires by itself (gateway.counters).
                    log.warning(
                        "gateway: could not count request %s out of channel %s", entry.request_id, channel.id
                    )

    async def choose(
        self, snapshot: Snapshot, caller: Caller, model: str | None, pinned: str | None, now: datetime
    ) -> tuple[ChannelView | None, Refusal | None]:
        """The channel that may take the request, or why none does now."""
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
            return None, chosen.refusal or Refusal(404, ErrorCode.MODEL_NOT_LOADED, "no channel serves this")
        return chosen.channel, None

    async def count_in(
        self, channel: ChannelView, caller: Caller, limits: Limits | None, now: datetime
    ) -> tuple[str | None, Refusal | None]:
        """Count the request in on ``channel`` (fair sharing's ``limits`` checked in the same
        step): its id, or why it may not go there now."""
        try:
            request_id = await self.counters.enter(
                channel.id, limits, user_id=caller.user_id, key_id=caller.key_id
            )
        except OverLimit as over:
            return None, over_limit_refusal(over, caller, now)
        if request_id is None:
            return None, switching_refusal(channel, caller, now)
        return request_id, None

    async def forward(
        self,
        receive: Receive,
        send: Send,
        channel: ChannelView,
        outgoing: Outgoing,
        usage: Usage,
        entry: Entry,
        on_disconnect: Callable[[Callable[[], None] | None], None] | None = None,
    ) -> None:
        assert channel.upstream is not None and channel.model is not None
        upstream = self.upstream_for(channel.upstream)
        target, headers, content, streaming, strip_usage = outgoing.to(channel, upstream)
        cancel = Cancel()
        # A client that goes away cancels the upstream's work at once, whatever stage it is at;
        # so does a count in that refuses the request while it is on its way.
        stop_watching = _watching(receive, on_disconnect, cancel)
        if entry.pending is not None:
            entry.pending.add_done_callback(functools.partial(_cancel_unless_counted, cancel))
        try:
            try:
                response = await upstream.send(outgoing.method.encode(), target, headers, content, cancel)
            except httpx.HTTPError as exc:
                if not await _settled(entry, cancel):
                    await refuse(send, entry.refused())
                elif not cancel.fired:
                    await refuse(send, did_not_answer(channel, exc))
                return
            if not await _settled(entry, cancel):  # refused after all: the process's answer is dropped
                await response.aclose()
                await refuse(send, entry.refused())
                return
            try:
                await self.relay(
                    send, response, streaming, strip_usage, usage, channel, cancel, stop_watching
                )
            finally:
                await response.aclose()
        finally:
            stop_watching()

    async def relay(
        self,
        send: Send,
        response: Reply,
        streaming: bool,
        strip_usage: bool,
        usage: Usage,
        channel: ChannelView,
        cancel: Cancel,
        stop_watching: Callable[[], None],
    ) -> None:
        """Send the upstream's answer to the client as it arrives."""
        headers, event_stream = passed_on(response.headers)
        if not streaming and not event_stream:
            try:
                content = await response.aread()
            except httpx.HTTPError as exc:
                if not cancel.fired:
                    await refuse(send, broke_off(channel, exc))
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


def passed_on(upstream_headers: list[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], bool]:
    """The headers of the upstream's answer that go on to the client, and whether the answer is
    a stream of server-sent events."""
    headers, event_stream = [], False
    for name, value in upstream_headers:
        lowered = name.lower()
        if lowered == b"content-type":
            event_stream = value.startswith(b"text/event-stream")
        if lowered not in HOP_BY_HOP and not is_cors_header(lowered):
            headers.append((name, value))
    return headers, event_stream


def process_failed_event(channel: ChannelView, exc: Exception) -> bytes:
    """The last event of a stream whose process died mid-way (the client can read it)."""
    event = {
        "error": {
            "message": f"channel {channel.name}'s process ended the stream: {exc!r}",
            "type": "server_error",
            "code": ErrorCode.UPSTREAM_FAILED,
        }
    }
    return b"data: " + json.dumps(event).encode() + b"\n\n"


class Entry:
    """A request's count in (``Counters.enter``): known before the request goes upstream, or
    ``pending`` (the future of its id, None if the gate was shut) while it goes up alongside."""

    def __init__(
        self,
        request_id: str | None = None,
        pending: Entering | None = None,
        why: Callable[[OverLimit | None], Refusal] | None = None,
    ) -> None:
        self.request_id = request_id
        self.pending = pending
        self.why = why  # the refusal if the pending count in finds the gate shut or a limit met
        self.over: OverLimit | None = None

    async def settled(self) -> bool:
        """Whether the request is counted in (waiting for Redis' answer if it is on its way)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            try:
                self.request_id = await pending
            except OverLimit as over:
                self.over = over
        return self.request_id is not None

    def refused(self) -> Refusal:
        if self.why is not None:
            return self.why(self.over)
        return Refusal(503, ErrorCode.MODEL_SWITCHING, "the channel is switching", 1)


async def _settled(entry: Entry, cancel: Cancel) -> bool:
    """``entry.settled()``; the upstream's work is cancelled unless the request is counted in."""
    try:
        counted = await entry.settled()
    except BaseException:
        cancel.fire()
        raise
    if not counted:
        cancel.fire()
    return counted


Entering = asyncio.Future[str | None]


def _cancel_unless_counted(cancel: Cancel, entering: Entering) -> None:
    if entering.cancelled() or entering.exception() is not None or entering.result() is None:
        cancel.fire()


def refusal_after_count_in(
    channel: ChannelView, caller: Caller, now: datetime, over: OverLimit | None
) -> Refusal:
    """Why a request that went upstream alongside its count in may not go in after all."""
    return switching_refusal(channel, caller, now) if over is None else over_limit_refusal(over, caller, now)


def switching_refusal(channel: ChannelView, caller: Caller, now: datetime) -> Refusal:
    """Why a request may not go in after all: the gate closed since the snapshot (the channel
    is switching)."""
    refusal = admit(caller_id=caller.user_id, channel=_with_switching(channel, True), now=now)
    return refusal or Refusal(503, ErrorCode.MODEL_SWITCHING, "the channel is switching", 1)


def _is_booker(channel: ChannelView, caller: Caller) -> bool:
    """Fair sharing's exemption: a booker in their own slot is not limited."""
    return channel.booking is not None and channel.booking.user_id == caller.user_id


@dataclass
class Outgoing:
    """What goes to the process: the caller's method, path and query, and the body (the JSON
    object, to be sent with ``model`` mapped, or the raw bytes when it is not JSON)."""

    method: str
    path: str
    query: bytes
    body: dict[str, Any] | None
    raw: bytes
    content_type: bytes

    def to(
        self, channel: ChannelView, upstream: UpstreamTransport
    ) -> tuple[bytes, list[tuple[bytes, bytes]], bytes, bool, bool]:
        """The request as it goes to ``channel``'s process: its target, headers and body
        (``model`` mapped to the channel's; usage asked for in a stream), whether the answer is
        asked to stream, and whether its usage event is the gateway's to hide."""
        body = self.body
        streaming = strip_usage = False
        if body is not None:
            if "model" in body or self.path.startswith("/v1/"):
                body["model"] = channel.model
            streaming = body.get("stream") is True
            if streaming and self.path in USAGE_OPTION_PATHS:
                options = body.get("stream_options")
                if not (isinstance(options, dict) and options.get("include_usage")):
                    # Ask for usage to count tokens, and hide the extra chunk from a client that did not.
                    body["stream_options"] = {
                        **(options if isinstance(options, dict) else {}),
                        "include_usage": True,
                    }
                    strip_usage = True
            content = dumps(body)
        else:
            content = self.raw
        target = upstream.target(self.path)  # quoted once per path; a query is added afresh
        if self.query:
            target += b"?" + self.query
        # The run's secret: the process answers nobody who does not have it (docs/security.md).
        headers = [(b"content-type", self.content_type), (b"authorization", channel.upstream_auth)]
        return target, headers, content, streaming, strip_usage


LIMIT_WORDS = {
    "user_concurrent": "you have {limit} requests in flight already, your limit outside your own slots",
    "key_concurrent": "this key has {limit} requests in flight already, its limit",
    "user_per_minute": "you reached your {limit} requests per minute outside your own slots",
    "key_per_minute": "this key reached its {limit} requests per minute",
}


def over_limit_refusal(over: OverLimit, caller: Caller, now: datetime) -> Refusal:
    """``429`` in OpenAI's shape, naming the limit and when it lifts."""
    limits = caller.limits
    assert limits is not None
    if over.limit == "weekly_tokens":
        lifts = week_start(now) + timedelta(days=7)
        return Refusal(
            429,
            ErrorCode.INSUFFICIENT_QUOTA,
            f"you used your {limits.user_weekly_tokens} tokens of this week outside your own slots; "
            f"the budget starts again on {lifts:%Y-%m-%d} 00:00 UTC (book a slot to keep going)",
            max(1, math.ceil((lifts - now).total_seconds())),
        )
    limit = {
        "user_concurrent": limits.user_concurrent,
        "key_concurrent": limits.key_concurrent,
        "user_per_minute": limits.user_per_minute,
        "key_per_minute": limits.key_per_minute,
    }[over.limit]
    return Refusal(
        429,
        ErrorCode.RATE_LIMIT_EXCEEDED,
        LIMIT_WORDS[over.limit].format(limit=limit),
        max(1, over.retry_after),
    )


# Refusals a caller may ask to wait out (X-SlotServe-Wait): the model will be ready.
WAITABLE = frozenset({ErrorCode.MODEL_LOADING, ErrorCode.MODEL_SWITCHING})
HOLD_POLL_SECONDS = 0.2
HOLD_COMMENT_SECONDS = 5.0
SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


async def send_event_error(send: Send, refusal: Refusal) -> None:
    """A refusal as the last event of a stream that has begun (its status was 200 already)."""
    event = json.loads(error_body(refusal.status, refusal.code, refusal.message))
    await send({"type": "http.response.body", "body": b"data: " + json.dumps(event).encode() + b"\n\n"})


def _continuing_stream(send: Send) -> Send:
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


def wait_seconds(scope: Scope, caller: Caller, most: float) -> tuple[float, str]:
    """How long to hold this request if its model is not ready: ``X-SlotServe-Wait`` (seconds),
    else the key's default; at most ``SLOTSERVE_GATEWAY_MAX_WAIT_SECONDS``. And what is wrong
    with the header, if anything."""
    given = _header(scope, b"x-slotserve-wait")
    if not given:
        return min(caller.wait_seconds, most), ""
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        return (
            0.0,
            f"X-SlotServe-Wait must be a number of seconds (0 or more), not {given.decode('latin-1')!r}",
        )
    return min(seconds, most), ""


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _header(scope: Scope, name: bytes) -> bytes:
    return next((v for k, v in scope["headers"] if k == name), b"")


def _adding_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return sending


def _without_body(send: Send) -> Send:
    """For HEAD: the answer's status and headers (its length included), no body bytes."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.body":
            if message.get("more_body"):
                return
            message = {"type": "http.response.body", "body": b""}
        await send(message)

    return sending


def _with_switching(channel: ChannelView, switching: bool) -> ChannelView:
    from dataclasses import replace

    return replace(channel, switching=switching) if switching != channel.switching else channel


# A server's offer in the scope's extensions (gateway.server does): ``on_disconnect(callback)``
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
