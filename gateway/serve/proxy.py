"""The OpenAI-compatible gateway: a small ASGI application in front of the channels.

Any ``POST`` under ``/v1/`` (chat, completions, embeddings, the Responses and Anthropic
Messages APIs, rerank, audio …) or to llama-server's own paths (``/tokenize``, ``/infill`` …)
whose JSON names a ``model`` is routed by that model; ``GET``/``HEAD /v1/models`` and
``/v1/models/{id}`` list what the caller may use (``gateway.serve.model_list``); under
``/channels/<name>/`` every path and method goes to that channel's process.

A request goes through the same stages here and in the fast lane (``gateway.serve.fast_lane``),
each a room of the gateway along its flow (docs/architecture.md): who is calling and what they
ask (``gateway.admit.request``), may it go, where and how (the admission step,
``gateway.admit.step``, pure, run by ``gateway.serve.admitting``'s loop here and once by the
lane), send it (``gateway.stream.lent``, ``gateway.stream.relay``), count it
(``gateway.stream.answer``). Every refusal is built in ``gateway.admit.refusals``, in the
caller's API's own shape. This module answers what is not a request for a process (the list of
models, an admin endpoint, a path nobody serves) and carries the rest upstream once admitted.
"""

from __future__ import annotations

import contextlib
import logging
import time

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone
from redis.exceptions import RedisError

from gateway.admit.places import Places, takes_place
from gateway.admit.refusals import (
    error_body,
    error_flavour,
    refuse,
    respond,
    unreachable,
)
from gateway.admit.request import (
    ROOT_PATHS,
    asked,
    authenticate,
    flavour_of,
    header,
    is_admin_endpoint,
    path_problem,
    split_path,
    too_large,
)
from gateway.admit.snapshot import Snapshot, SnapshotCache
from gateway.admit.step import (
    Admission,
)
from gateway.rules import key_scope
from gateway.rules.access import Refusal
from gateway.rules.body import BodyTooLarge
from gateway.rules.callers import Caller
from gateway.rules.cors import CorsPolicy
from gateway.serve import on_demand
from gateway.serve.admitting import admitted
from gateway.serve.model_list import ModelList
from gateway.stream.answer import Answer
from gateway.stream.events import Usage
from gateway.stream.holding import Holding
from gateway.stream.lent import carry
from gateway.stream.outgoing import Outgoing
from gateway.stream.relay import ON_DISCONNECT, adding_headers, continuing_stream, without_body
from gateway.stream.tenancy import Tenancy
from gateway.types import Receive, Scope, Send
from gateway.wire.counters import Counters
from gateway.wire.upstream import UpstreamTransport
from slotserve_base.vocabulary import ErrorCode

log = logging.getLogger(__name__)


class Gateway:
    # Whether the gateway's server may carry requests that can go upstream at once in its fast
    # lane (``gateway.serve.fast_lane``), outside this application.
    lane = True

    def __init__(self) -> None:
        self.snapshots = SnapshotCache(settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS)
        self.counters = Counters(settings.REDIS_URL)
        self.places = Places(self.counters)
        # Every request in flight in this process, watched for a slot's edge.
        self.tenancy = Tenancy(self.snapshots, self.places.lending)
        self.upstreams: dict[str, UpstreamTransport] = {}
        self.max_body = settings.SLOTSERVE_GATEWAY_MAX_BODY_BYTES
        self.max_wait = settings.SLOTSERVE_GATEWAY_MAX_WAIT_SECONDS
        self.cors = CorsPolicy(settings.SLOTSERVE_CORS_ORIGINS)
        # What each run's process says of its model (llama-server's meta, n_ctx), asked once.
        self.models = ModelList(self.counters, self)

    async def ask_on_demand(self, caller: Caller, model: str) -> Refusal | None:
        return await on_demand.ask_on_demand(caller, model)

    def upstream_for(self, upstream: str) -> UpstreamTransport:
        """One pool of connections per upstream process."""
        transport = self.upstreams.get(upstream)
        if transport is None:
            transport = self.upstreams[upstream] = UpstreamTransport(upstream)
        return transport

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.cors.enabled:
            origin = header(scope, b"origin")
            if origin:
                if scope["method"] == "OPTIONS" and header(scope, b"access-control-request-method"):
                    # A browser's preflight carries no key: answered before authentication.
                    headers = self.cors.preflight_headers(
                        origin, header(scope, b"access-control-request-headers")
                    )
                    await send({"type": "http.response.start", "status": 204, "headers": headers})
                    await send({"type": "http.response.body", "body": b""})
                    return
                if self.cors.allows(origin):
                    send = adding_headers(send, self.cors.answer_headers(origin))
        if scope["method"] == "HEAD":  # what GET would answer, without the body
            scope = {**scope, "method": "GET"}
            send = without_body(send)
        token = error_flavour.set(flavour_of(scope["path"]))
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
            error_flavour.reset(token)
        if not answer.counted and answer.status is not None:
            with contextlib.suppress(RedisError):  # a count for /metrics is not worth an error
                await self.counters.answered(answer.status, record=answer.record(self.counters.new_id()))

    async def handle(self, scope: Scope, receive: Receive, send: Send, answer: Answer) -> None:
        pinned, path = split_path(scope["path"])
        method = scope["method"]
        problem = path_problem(scope["path"])
        if problem is not None:
            answer.method, answer.path = method, scope["path"]
            message = (
                f"the path has {problem}: send the endpoint's path as it is named, with nothing to resolve"
            )
            await respond(send, 400, error_body(400, ErrorCode.INVALID_REQUEST, message))
            return
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
        gone = key_scope.expired(caller, timezone.now())
        if gone is not None:
            await refuse(send, gone)
            return
        if path == "/v1/models" and method == "GET":
            await self.models.answer(send, snapshot, caller, pinned)
        elif path.startswith("/v1/models/") and method == "GET":
            await self.models.answer(send, snapshot, caller, pinned, only=path[len("/v1/models/") :])
        elif is_admin_endpoint(method, path) and not caller.is_staff:
            whose = f"channel {pinned}'s process" if pinned is not None else "a model's process"
            message = f"{method} {path} is an admin endpoint of {whose}: staff only"
            await respond(send, 403, error_body(403, ErrorCode.ADMIN_ONLY, message))
        elif pinned is not None or (method == "POST" and (path.startswith("/v1/") or path in ROOT_PATHS)):
            await self.proxy(scope, receive, send, snapshot, caller, pinned, path, answer)
        else:
            await respond(
                send, 404, error_body(404, ErrorCode.NOT_FOUND, f"no endpoint {method} {scope['path']}")
            )

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
            await refuse(send, too_large(self.max_body))
            return
        if raw is None:
            return
        request = asked(
            scope,
            raw,
            caller,
            snapshot,
            pinned=pinned,
            path=path,
            max_body=self.max_body,
            max_wait=self.max_wait,
        )
        if isinstance(request, Refusal):
            await refuse(send, request)
            return
        answer.model = request.named
        state = Admission(
            caller,
            request.model,
            pinned,
            takes_place(scope["method"], path),
            deadline=time.monotonic() + request.wait,
        )
        body = request.body
        holding = Holding(receive, send, stream=body is not None and body.get("stream") is True)
        # Observe, step, act (``gateway.admit.step``): until the request may go upstream, is
        # refused, or its client leaves.
        going = await admitted(self, state, request, snapshot, holding, answer)
        if going is None:
            return
        go, entry = going
        channel = go.channel
        if holding.begun:
            send = continuing_stream(send)
        answer.goes_to(channel)
        usage = Usage.asking(body)
        outgoing = Outgoing.of(request, scope["method"], scope.get("query_string", b""))
        try:
            on_disconnect = (scope.get("extensions") or {}).get(ON_DISCONNECT)
            await carry(self, receive, send, channel, outgoing, usage, entry, on_disconnect, answer, caller)
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
                        reservation_id=answer.used_booking,
                        prompt=usage.prompt,
                        completion=usage.completion,
                        status=answer.status,
                        ttft_seconds=answer.ttft_seconds,
                        record=answer.record(entry.request_id, usage),
                    )
                except RedisError:
                    # The answer went out; its in-flight entry expires by itself (gateway.wire.counters).
                    log.warning(
                        "gateway: could not count request %s out of channel %s", entry.request_id, channel.id
                    )
