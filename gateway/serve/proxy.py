"""The OpenAI-compatible gateway: a small ASGI application in front of the channels.

Any ``POST`` under ``/v1/`` (chat, completions, embeddings, the Responses and Anthropic
Messages APIs, rerank, audio …) or to llama-server's own paths (``/tokenize``, ``/infill`` …)
whose JSON names a ``model`` is routed by that model; ``GET``/``HEAD /v1/models`` and
``/v1/models/{id}`` list what the caller may use (``gateway.serve.model_list``); under
``/channels/<name>/`` every path and method goes to that channel's process.

A request goes through the same stages here and in the fast lane (``gateway.serve.fast_lane``),
each a room of the gateway along its flow (docs/architecture.md): who is calling and what they
ask (``gateway.admit.request``), where it goes (``gateway.rules.access``, pure), may it go now
(``gateway.admit.admission``, with ``gateway.wire.counters``), send it (``gateway.stream.outgoing``,
``gateway.stream.relay``), count it (``gateway.stream.answer``). Every refusal is built in
``gateway.admit.refusals``, in the caller's API's own shape. This module holds what only the
application does: holding a request that asked to wait, and answering the rest.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone
from redis.exceptions import RedisError

from gateway.admit.admission import Entry
from gateway.admit.places import Places, takes_place
from gateway.admit.refusals import (
    error_body,
    error_flavour,
    held_cap,
    refuse,
    respond,
    send_event_error,
    unreachable,
)
from gateway.admit.request import (
    ROOT_PATHS,
    Asked,
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
    Abandon,
    Action,
    Admission,
    CountFlights,
    CountHeld,
    CountIn,
    Forward,
    GiveBack,
    Go,
    GoNow,
    Hold,
    Refuse,
    Seen,
    WaitTurn,
    step,
)
from gateway.rules import key_scope
from gateway.rules.access import Refusal
from gateway.rules.body import BodyTooLarge
from gateway.rules.callers import Caller
from gateway.rules.cors import CorsPolicy
from gateway.serve.model_list import ModelList
from gateway.stream.answer import Answer
from gateway.stream.events import Usage
from gateway.stream.holding import Holding, wait_turn
from gateway.stream.lent import carry
from gateway.stream.outgoing import Outgoing
from gateway.stream.relay import ON_DISCONNECT, adding_headers, continuing_stream, without_body
from gateway.stream.tenancy import Tenancy
from gateway.types import Receive, Scope, Send
from gateway.wire.counter_scripts import OverLimit
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
        hold_token = uuid.uuid4().hex
        seen, now = self.seen(snapshot), answer.decide()
        try:
            # Observe, step, act (``gateway.admit.step``): until the request goes upstream, is
            # refused, or its client leaves.
            while True:
                state, action = step(state, seen, now)
                if isinstance(action, GoNow | Forward):
                    break
                if isinstance(action, Refuse):
                    if holding.begun:  # the stream has begun: the refusal is its last event
                        await send_event_error(send, action.refusal)
                    else:
                        await refuse(send, action.refusal)
                    return
                if isinstance(action, Abandon):
                    return  # the client left: nothing went upstream
                seen, now = await self.act(action, seen, now, caller, request, holding, answer, hold_token)
        finally:
            # The client may have left while the gateway looked again (outside the wait).
            gone = holding.close()
            if state.held:
                with contextlib.suppress(RedisError):  # the entry expires by itself anyway
                    await self.counters.unhold(caller.user_id, hold_token)
        go = action.go
        channel = go.channel
        if isinstance(action, GoNow):
            # Nothing to wait for, and no limit to check or room under them: the request goes
            # upstream while Redis counts it in (and checks the limits); nothing comes back
            # before it is counted.
            self.take_room(go, caller)
            entry = Entry.soon(self.counters, go, caller, now)
        else:
            entry = Entry(action.request_id)
        if gone:
            if await entry.settled():  # counted in: count it out, unsent
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

    def seen(self, snapshot: Snapshot, **outcome: Any) -> Seen:
        """What the admission step sees now: the snapshot, the clock, the room noted for
        requests that go at once, and what the last action came to (``outcome``)."""
        return Seen(
            snapshot.channels,
            time.monotonic(),
            snapshot.index,
            place_room=self.places.room,
            limit_room=self.counters.room,
            **outcome,
        )

    def take_room(self, go: Go, caller: Caller) -> None:
        """A request goes at once: it takes the room the step saw for it."""
        if go.queued:
            self.places.may_take(go.channel.id)
        if go.limits is not None:
            self.counters.may_go_ahead(caller.user_id, caller.key_id)

    async def act(
        self,
        action: Action,
        seen: Seen,
        now: datetime,
        caller: Caller,
        request: Asked,
        holding: Holding,
        answer: Answer,
        hold_token: str,
    ) -> tuple[Seen, datetime]:
        """Do what the admission step said (short of going upstream or answering): what is seen
        next, and the moment the next step decides at."""
        if isinstance(action, CountFlights):
            return replace(seen, in_flight=await self.counters.in_flight(action.channel_ids)), now
        if isinstance(action, WaitTurn):
            place, refusal = await wait_turn(self.places, action.go, caller, request, holding, answer)
            left = place is None and refusal is None
            # Its turn: looked at again with the channels as they are now.
            return self.seen(await self.snapshots.get(), turn=place or refusal, left=left), answer.decide()
        if isinstance(action, CountIn):
            go = action.go
            try:
                entered: str | OverLimit | None = await self.counters.enter(
                    go.channel.id,
                    go.limits,
                    user_id=caller.user_id,
                    key_id=caller.key_id,
                    request_id=action.place,
                )
            except OverLimit as over:
                entered = over
            return replace(seen, entered=entered, clock=time.monotonic()), now
        if isinstance(action, GiveBack):
            await self.places.leave(action.channel_id, action.place, caller.user_id)
            return seen, now
        if isinstance(action, CountHeld):
            held_ok = await self.counters.hold(caller.user_id, hold_token, held_cap(caller))
            return replace(seen, held_ok=held_ok, clock=time.monotonic()), now
        assert isinstance(action, Hold), action
        await holding.comment(action.note)
        if await holding.pause(action.seconds):
            return replace(seen, left=True), now
        return self.seen(await self.snapshots.get()), answer.decide()
