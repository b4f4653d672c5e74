"""Every refusal the gateway gives, built in one place, in the caller's API's shape (OpenAI's, or
Anthropic's on ``/v1/messages``): the status, code, message and ``Retry-After`` of each."""

from __future__ import annotations

import json
import math
from contextvars import ContextVar
from datetime import datetime, timedelta, tzinfo

from django.conf import settings

from gateway.rules.access import ChannelView, Refusal, admit, told_at, with_switching
from gateway.rules.callers import Caller
from gateway.types import Send
from gateway.wire.counter_scripts import OverLimit, week_start
from slotserve_base.vocabulary import ErrorCode

# Seconds a client waits before trying again when Redis or the database is unreachable.
UNAVAILABLE_RETRY_AFTER = 5


# Seconds a caller with as many held requests as they may waits before trying again.
HELD_RETRY_AFTER = 5


# Which API's error shape this request gets: "openai", or "anthropic" on /v1/messages.
error_flavour: ContextVar[str] = ContextVar("slotserve_error_flavour", default="openai")


ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(status: int, code: str, message: str, flavour: str | None = None) -> bytes:
    """An error in the caller's API's shape (``flavour``, else the request's being answered)."""
    if (flavour or error_flavour.get()) == "anthropic":
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
    # Sent through the request's Answer (``gateway.stream.answer``): its log record keeps why.
    noted = getattr(getattr(send, "__self__", None), "refused", None)
    if noted is not None:
        noted(refusal)
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


def queue_full(whose: str, retry_after: int, channel: ChannelView) -> Refusal:
    """The answer when a request may not wait for a place on ``channel`` (``gateway.admit.places``):
    the caller has as many waiting as they may (429), or the channel's queue is full (503)."""
    if whose == "user":
        message = (
            f"you already have {settings.SLOTSERVE_QUEUE_PER_USER} requests waiting for a place on "
            f"channel {channel.name}, as many as you may; try again when some are answered"
        )
        return Refusal(429, ErrorCode.QUEUE_FULL, message, retry_after)
    message = (
        f"channel {channel.name} is busy: {settings.SLOTSERVE_QUEUE_PER_CHANNEL} requests are waiting "
        "for a place, as many as may"
    )
    return Refusal(503, ErrorCode.CHANNEL_QUEUE_FULL, message, retry_after)


def did_not_answer(channel: ChannelView, exc: Exception) -> Refusal:
    """The answer when ``channel``'s process cannot be reached, or closes before it answers."""
    message = f"channel {channel.name}'s process did not answer: {exc!r}"
    return Refusal(502, ErrorCode.UPSTREAM_UNREACHABLE, message)


def broke_off(channel: ChannelView, exc: Exception) -> Refusal:
    """The answer when ``channel``'s process stops partway through an answer that is not streamed."""
    message = f"channel {channel.name}'s process broke off its answer: {exc!r}"
    return Refusal(502, ErrorCode.UPSTREAM_FAILED, message)


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


# A borrowed request ended by its booker's may try again at once: its new request waits its turn
# in the channel's fair queue for the next free place, at no cost to anyone (a booker works in
# bursts). ``Retry-After: 0``.
PREEMPTED_RETRY_AFTER = 0


def preempted(channel: ChannelView) -> Refusal:
    """A borrowed request ended by the booker's request before its answer began (docs/gateway.md,
    "Lending")."""
    return Refusal(
        503,
        ErrorCode.PREEMPTED_BY_BOOKER,
        f"channel {channel.name}'s booker needed its place: your borrowed request was ended "
        "(what it was sent is counted to you); send it again: it waits its turn for the next free place",
        PREEMPTED_RETRY_AFTER,
        channel.id,
    )


def preempted_event(channel: ChannelView) -> bytes:
    """The last event of a borrowed stream ended by the booker's request, in the caller's API's
    shape."""
    return event_of(preempted(channel))


def event_of(refusal: Refusal, flavour: str | None = None) -> bytes:
    """A refusal as the last event of a stream, in the caller's API's shape."""
    return b"data: " + error_body(refusal.status, refusal.code, refusal.message, flavour) + b"\n\n"


def ended_at_slot(channel: ChannelView, *, borrowed_now: bool, zone: tzinfo) -> Refusal:
    """Why a request in flight ends at a slot's edge (docs/gateway.md, "A slot's first second"):
    someone else's slot began and lends nothing (``slot_began``, to try again at its end), or
    the slot it borrowed stopped lending (``preempted_by_booker``). Either way what it was sent
    is counted to its caller, not what it asked for."""
    booking = channel.booking
    assert booking is not None
    if borrowed_now:
        return Refusal(
            503,
            ErrorCode.PREEMPTED_BY_BOOKER,
            f"channel {channel.name}'s booker stopped lending their slot: your borrowed request was "
            "ended (what it was sent is counted to you)",
            PREEMPTED_RETRY_AFTER,
            channel.id,
        )
    began = booking.start or booking.end
    return Refusal(
        503,
        ErrorCode.SLOT_BEGAN,
        f"channel {channel.name} is reserved by someone else from {told_at(began, zone)} "
        f"until {told_at(booking.end, zone)}: your request, begun before, was ended as the slot began "
        "(what it was sent is counted to you)",
        max(1, math.ceil((booking.end - began).total_seconds())),
        channel.id,
    )


def refusal_after_count_in(
    channel: ChannelView, caller: Caller, now: datetime, over: OverLimit | None
) -> Refusal:
    """Why a request that went upstream alongside its count in may not go in after all."""
    return switching_refusal(channel, caller, now) if over is None else over_limit_refusal(over, caller, now)


def switching_refusal(channel: ChannelView, caller: Caller, now: datetime) -> Refusal:
    """Why a request may not go in after all: the gate closed since the snapshot (the channel
    is switching)."""
    refusal = admit(
        caller_id=caller.user_id, channel=with_switching(channel, True), now=now, zone=caller.zone
    )
    return refusal or Refusal(503, ErrorCode.MODEL_SWITCHING, "the channel is switching", 1)


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
    if over.limit in ("weekly_tokens", "key_weekly_tokens"):
        lifts = week_start(now) + timedelta(days=7)
        used = (
            f"you used your {limits.user_weekly_tokens} tokens of this week outside your own slots"
            if over.limit == "weekly_tokens"
            else f"this key used its {limits.key_weekly_tokens} tokens of this week outside your own slots"
        )
        return Refusal(
            429,
            ErrorCode.INSUFFICIENT_QUOTA,
            f"{used}; the budget starts again on {lifts:%Y-%m-%d} 00:00 UTC (book a slot to keep going)",
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


async def send_event_error(send: Send, refusal: Refusal) -> None:
    """A refusal as the last event of a stream that has begun (its status was 200 already)."""
    event = json.loads(error_body(refusal.status, refusal.code, refusal.message))
    await send({"type": "http.response.body", "body": b"data: " + json.dumps(event).encode() + b"\n\n"})
