"""Who may call the gateway, and which channel serves a request (the access table of
docs/gateway.md), as pure functions."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from functools import cached_property

from slotserve_base.vocabulary import ErrorCode, Phase


@dataclass(frozen=True)
class Booking:
    """An approved reservation on a channel: the active one, or the next within a snapshot's life."""

    reservation_id: int
    user_id: int
    exclusive: bool
    end: datetime
    target: tuple[int, int | None] | None = None  # its model and preset (ids); None: whole card
    start: datetime | None = None
    lends: bool = False  # others may borrow its model while its booker is idle (docs/gateway.md)


@dataclass(frozen=True)
class ChannelView:
    """A channel as the gateway sees it: what runs, whether it may take requests."""

    id: int
    name: str
    phase: str  # stopped, loading, ready, draining, stopping, failed
    model: str | None  # the alias of the model that runs (or loads)
    upstream: str | None  # "http://host:port" while a process runs
    since: datetime
    load_seconds: float  # estimate for what loads now
    next_load_seconds: float  # estimate for the target it switches to
    drain_seconds: float
    switching: bool  # the node worker closed the gate: the target changed
    booking: Booking | None = None
    targets_model: str | None = None  # the model the channel is heading for
    upstream_key: str = field(default="", repr=False)  # the run's secret, sent upstream only
    stop_seconds: float = 0.0  # the stop grace (SIGTERM to SIGKILL) a switch may take
    retry_at: datetime | None = None  # when a failed channel tries its target again
    running: tuple[int, int | None] | None = None  # the model and preset (ids) that run or load
    fallback: bool = False  # the default serves a booking whose model failed (docs/scheduling.md)
    places: int | None = None  # requests its process serves at once; None: no fair queue
    node: str = ""  # the node's name
    node_ready: bool = True  # its node worker reports (docs/node-workers.md, "Heartbeats")
    crashed: bool = False  # failed after it was ready (killed, crashed), not while loading
    upcoming: Booking | None = None  # the next booking, if it begins within the snapshot's life
    on_demand: bool = False  # its target is a model loaded on demand (docs/scheduling.md)
    ready_at: float = 0.0  # when its process became ready (Unix time); 0 unless ready

    @cached_property
    def upstream_auth(self) -> bytes:
        """The ``Authorization`` header's value for the process (its run's secret)."""
        return f"Bearer {self.upstream_key}".encode()


@dataclass(frozen=True)
class Refusal:
    status: int
    code: str
    message: str
    retry_after: int | None = None
    channel_id: int | None = None  # the channel it was for, when one was (the request log keeps it)


@dataclass(frozen=True)
class Route:
    channel: ChannelView | None
    refusal: Refusal | None = None
    candidates: tuple[str, ...] = field(default=())


def _seconds(value: float) -> int:
    return max(1, math.ceil(value))


# Retry-After is never shorter than the real wait: estimates err, so a tenth of the load and a
# second more (a client that retried early would only be refused again).
MARGIN_SHARE, MARGIN_SECONDS = 0.1, 1.0


def _margin(load_estimate: float) -> float:
    return MARGIN_SHARE * load_estimate + MARGIN_SECONDS


def _remaining(total: float, since: datetime, now: datetime) -> float:
    return total - (now - since).total_seconds()


def told_at(moment: datetime, zone: tzinfo, *, year: bool = False) -> str:
    """A moment as a refusal tells it: in the caller's zone, the instant beside it
    ("Mon 7 Dec 10:00 CET (2026-12-07T09:00:00Z)")."""
    local = moment.astimezone(zone)
    day = f"{local:%a} {local.day} {local:%b}" + (f" {local:%Y}" if year else "")
    return f"{day} {local:%H:%M %Z} ({moment.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ})"


def as_of(channel: ChannelView, now: datetime) -> ChannelView:
    """``channel`` at ``now``: a snapshot lives up to ``SLOTSERVE_GATEWAY_REFRESH_SECONDS``, and
    a slot that begins or ends meanwhile counts from its first or last moment, not from the
    next snapshot."""
    upcoming, booking = channel.upcoming, channel.booking
    if upcoming is not None and upcoming.start is not None and upcoming.start <= now:
        return dataclasses.replace(channel, booking=upcoming, upcoming=None)
    if booking is not None and booking.end <= now:
        return dataclasses.replace(channel, booking=None)
    return channel


def lends_to(caller_id: int, channel: ChannelView) -> bool:
    """Whether ``caller_id`` may borrow ``channel`` now (docs/gateway.md, "Lending"): someone
    else's booking there lends, its own model and preset run and are ready (not the fallback, not
    a switch), and the channel counts its places, so that the booker's requests can end borrowed
    ones. ``channel`` as of now (``as_of``)."""
    booking = channel.booking
    return (
        booking is not None
        and booking.lends
        and booking.user_id != caller_id
        and booking.target is not None
        and channel.running == booking.target
        and not channel.fallback
        and channel.phase == Phase.READY
        and not channel.switching
        and channel.upstream is not None
        and channel.places is not None
    )


def with_switching(channel: ChannelView, switching: bool) -> ChannelView:
    """``channel`` as the gateway sees it with its gate shut (``switching``) or open."""
    return dataclasses.replace(channel, switching=switching) if switching != channel.switching else channel


def is_booker(caller_id: int, channel: ChannelView) -> bool:
    """Whether ``caller_id`` holds ``channel``'s slot now: alone on it, never queued, not
    limited (fair sharing's exemption)."""
    return channel.booking is not None and channel.booking.user_id == caller_id


def borrowed(caller_id: int, channel: ChannelView) -> bool:
    """Whether a request of ``caller_id`` that ``channel`` (as of now) admits is a borrowed one."""
    return channel.booking is not None and channel.booking.user_id != caller_id


class Stay:
    """What becomes of a request in flight on a channel at a slot's edge (``staying``)."""

    ON = "on"  # it goes on as it is
    BORROWED = "borrowed"  # it goes on, borrowed: the booker's requests may end it
    ENDS = "ends"  # it ends now


def staying(*, caller_id: int, borrowed_now: bool, channel: ChannelView) -> str:
    """Whether a request of ``caller_id`` already in flight on ``channel`` (as of now,
    ``as_of``) may go on (docs/gateway.md, "A slot's first second"). A slot is its booker's from
    its first moment: someone else's request begun before it becomes borrowed where the slot
    lends its running model now, and ends where it does not; a borrowed request ends when its
    slot stops lending. Outside slots, and for the booker, requests go on."""
    booking = channel.booking
    if booking is None or booking.user_id == caller_id:
        return Stay.ON
    if lends_to(caller_id, channel):
        return Stay.ON if borrowed_now else Stay.BORROWED
    return Stay.ENDS


def admit(*, caller_id: int, channel: ChannelView, now: datetime, zone: tzinfo = UTC) -> Refusal | None:
    """The access table (docs/gateway.md) for one caller and one channel; None means allowed.
    Times are told in the caller's ``zone``, the instant beside them; a refusal names the channel."""
    refusal = _admit(caller_id, channel, now, zone)
    return None if refusal is None else dataclasses.replace(refusal, channel_id=channel.id)


def _admit(caller_id: int, channel: ChannelView, now: datetime, zone: tzinfo) -> Refusal | None:
    channel = as_of(channel, now)
    booking = channel.booking
    if booking is not None and booking.user_id != caller_id and not lends_to(caller_id, channel):
        return Refusal(
            403,
            ErrorCode.GPU_RESERVED,
            f"channel {channel.name} is reserved by someone else until {told_at(booking.end, zone)}",
        )
    if booking is not None and booking.exclusive:
        return Refusal(
            503,
            ErrorCode.GPU_EXCLUSIVE,
            f"channel {channel.name} is booked whole-card: no inference process runs during your reservation",
            _seconds((booking.end - now).total_seconds()),
        )
    # The booker's slot has begun but the channel still runs another target (the last booking's,
    # or the default) until the node worker closes the gate: they are not served someone else's
    # model, they are told it is switching. The fallback (their model failed, the default
    # serves them meanwhile) is the exception.
    behind = (
        booking is not None
        and booking.target is not None
        and channel.running is not None
        and channel.running != booking.target
        and not channel.fallback
        and channel.phase == Phase.READY
    )
    if behind or channel.switching or channel.phase in (Phase.DRAINING, Phase.STOPPING):
        drain_left = (
            max(_remaining(channel.drain_seconds, channel.since, now), 0)
            if channel.phase == Phase.DRAINING
            else 0
            if channel.phase == Phase.STOPPING
            else channel.drain_seconds
        )
        return Refusal(
            503,
            ErrorCode.MODEL_SWITCHING,
            f"channel {channel.name} is switching models",
            _seconds(
                drain_left
                + channel.stop_seconds
                + channel.next_load_seconds
                + _margin(channel.next_load_seconds)
            ),
        )
    if not channel.node_ready and (channel.phase != Phase.READY or channel.upstream is None):
        # Nothing starts or finishes loading on a node whose worker does not report: no time
        # to wait for (route prefers any other answer).
        return Refusal(
            503,
            ErrorCode.NODE_NOT_READY,
            f"channel {channel.name} cannot load {channel.targets_model or channel.model or 'a model'}: "
            f"its node {channel.node} is not ready (its node worker is not reporting)",
        )
    if channel.phase == Phase.LOADING:
        left = max(_remaining(channel.load_seconds, channel.since, now), 0)
        return Refusal(
            503,
            ErrorCode.MODEL_LOADING,
            f"channel {channel.name} is loading {channel.model}",
            _seconds(left + _margin(channel.load_seconds)),
        )
    if channel.phase != Phase.READY or channel.upstream is None or channel.model is None:
        if channel.targets_model is not None and channel.phase == Phase.FAILED:
            return Refusal(
                503,
                ErrorCode.MODEL_LOADING,
                (
                    f"channel {channel.name} stopped unexpectedly while serving {channel.targets_model}"
                    " and starts it again"
                    if channel.crashed
                    else f"channel {channel.name} failed to load {channel.targets_model} and tries again"
                )
                + (
                    f" in {_seconds((channel.retry_at - now).total_seconds())} s"
                    if channel.retry_at
                    else " soon"
                ),
                _seconds(max((channel.retry_at - now).total_seconds(), 0.0) if channel.retry_at else 0.0)
                + _seconds(channel.next_load_seconds + _margin(channel.next_load_seconds)),
            )
        if channel.targets_model is not None:
            # The decision names a model the node worker has not started yet (a new channel or
            # default, a whole-card booking just over): it is loading, whatever runs now.
            return Refusal(
                503,
                ErrorCode.MODEL_LOADING,
                f"channel {channel.name} is about to load {channel.targets_model}",
                _seconds(channel.next_load_seconds + _margin(channel.next_load_seconds)),
            )
        return Refusal(404, ErrorCode.MODEL_NOT_LOADED, f"channel {channel.name} runs no model now")
    return None


def _loaded_where(channels: Sequence[ChannelView], caller_id: int, now: datetime) -> str:
    """What is loaded where, of the channels the caller may use now (not another's slot)."""
    loaded = [
        f"{c.model} on {c.name}"
        for c in channels
        if c.phase == Phase.READY and c.model and admit(caller_id=caller_id, channel=c, now=now) is None
    ]
    return "; loaded now: " + ", ".join(loaded) if loaded else "; no model is loaded now"


def route(
    *,
    caller_id: int,
    model: str | None,
    pinned: str | None,
    channels: Sequence[ChannelView],
    in_flight: Mapping[int, int],
    now: datetime,
    zone: tzinfo = UTC,
) -> Route:
    """Which channel serves the request (docs/gateway.md's access table), and whether the caller
    may use it.

    An explicit pin wins; then the caller's active reservation; then the
    usable channels with the requested model loaded, fewest in-flight requests
    first, ties by name; otherwise ``404 model_not_loaded`` listing what is
    loaded where.
    """
    channels = [as_of(c, now) for c in channels]
    if pinned is not None:
        match = next((c for c in channels if c.name == pinned), None)
        if match is None:
            return Route(
                None,
                Refusal(
                    404,
                    ErrorCode.MODEL_NOT_LOADED,
                    f"no channel named {pinned!r}" + _loaded_where(channels, caller_id, now),
                ),
            )
        return Route(match, admit(caller_id=caller_id, channel=match, now=now, zone=zone))
    mine = next((c for c in channels if c.booking is not None and c.booking.user_id == caller_id), None)
    if mine is not None:
        return Route(mine, admit(caller_id=caller_id, channel=mine, now=now, zone=zone))
    if not model:
        return Route(None, Refusal(400, ErrorCode.INVALID_REQUEST, "the request names no model"))
    usable = [
        c for c in channels if c.model == model and admit(caller_id=caller_id, channel=c, now=now) is None
    ]
    if usable:
        # A free channel before one lent by its booker; then the fewest requests in flight.
        best = min(usable, key=lambda c: (borrowed(caller_id, c), in_flight.get(c.id, 0), c.name))
        return Route(best, None, tuple(c.name for c in usable))
    # Not servable now: say why, preferring the most useful answer.
    heading = [c for c in channels if model in (c.model, c.targets_model)]
    refusals = [
        r for c in heading if (r := admit(caller_id=caller_id, channel=c, now=now, zone=zone)) is not None
    ]
    waiting = [r for r in refusals if r.status == 503 and r.code != ErrorCode.NODE_NOT_READY]
    if waiting:
        return Route(None, min(waiting, key=lambda r: r.retry_after or 0))
    # Loaded, but where someone else booked it: say where and until when (the soonest free).
    reserved = [
        c for c in heading if c.model == model and c.booking is not None and c.booking.user_id != caller_id
    ]
    if reserved:
        soonest = min(reserved, key=lambda c: (c.booking.end if c.booking else now, c.name))
        return Route(None, admit(caller_id=caller_id, channel=soonest, now=now, zone=zone))
    if refusals and all(r.code == ErrorCode.GPU_RESERVED for r in refusals):
        return Route(None, refusals[0])
    stranded = [r for r in refusals if r.code == ErrorCode.NODE_NOT_READY]
    if stranded:
        return Route(None, stranded[0])
    return Route(
        None,
        Refusal(
            404,
            ErrorCode.MODEL_NOT_LOADED,
            f"model {model!r} is not loaded" + _loaded_where(channels, caller_id, now),
        ),
    )


def models_for(*, caller_id: int, channels: Sequence[ChannelView], now: datetime) -> list[tuple[str, str]]:
    """``/v1/models``: (model, channel) pairs the caller can use right now."""
    return sorted(
        (c.model, c.name)
        for c in channels
        if c.model is not None and admit(caller_id=caller_id, channel=c, now=now) is None
    )
