"""What the gateway knows without asking the database on every request.

Each gateway process keeps a snapshot of API keys, channels, what runs on
them and the active reservations, read in one go and refreshed at most every
``SLOTSERVE_GATEWAY_REFRESH_SECONDS``. The facts that must be exact at the
moment of a request — in-flight counts and a channel's switching gate — live
in Redis (``gateway.wire.counters``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import zoneinfo
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from functools import cached_property

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from gateway.rules.access import Booking, ChannelView
from gateway.rules.callers import Caller, Limits
from gateway.rules.channel_index import ChannelIndex
from slotserve_base.hosts import url_host
from slotserve_base.vocabulary import SERVING_PHASES, Phase, Reason

log = logging.getLogger(__name__)


@functools.cache
def zone_named(name: str) -> tzinfo:
    """A profile's time zone; UTC for a name the system does not know."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return UTC


@dataclass(frozen=True)
class Snapshot:
    callers: dict[str, Caller] = field(default_factory=dict)  # by hashed key
    channels: tuple[ChannelView, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)  # alias → the model's name
    taken_at: float = 0.0
    on_demand_models: frozenset[str] = frozenset()  # models a request may load (docs/scheduling.md)

    @cached_property
    def index(self) -> ChannelIndex:
        """The channels by booker and by ready model (``gateway.serve.fast_lane``'s look-up)."""
        return ChannelIndex.of(self.channels)


def read_snapshot() -> Snapshot:
    """One read of everything the gateway needs, on a connection closed afterwards
    (it runs in a worker thread once a second; no idle connection is left behind)."""
    from django.db import connection

    try:
        return _read_snapshot()
    finally:
        connection.close()


def channel_views_now() -> tuple[ChannelView, ...]:
    """The channels as the gateway would see them now, on the caller's own connection (a page's:
    it names models the person may call)."""
    return channel_views(timezone.now())


def limits_reader() -> Callable[..., Limits | None]:
    """The installation's limits with each user's own overrides (``SharingLimits``)."""
    from gateway.models import SharingLimits

    own = {
        user_id: (conc, rpm, tokens)
        for user_id, conc, rpm, tokens in SharingLimits.objects.values_list(
            "user_id", "max_concurrent", "requests_per_minute", "weekly_tokens"
        )
    }
    defaults = (
        settings.SLOTSERVE_LIMIT_CONCURRENT_REQUESTS,
        settings.SLOTSERVE_LIMIT_REQUESTS_PER_MINUTE,
        settings.SLOTSERVE_LIMIT_WEEKLY_TOKENS,
    )

    def limits(
        user_id: int,
        key_concurrent: int | None,
        key_per_minute: int | None,
        key_weekly_tokens: int | None = None,
    ) -> Limits | None:
        mine = own.get(user_id, (None, None, None))
        conc, rpm, tokens = (d if o is None else o for o, d in zip(mine, defaults, strict=True))
        found = Limits(conc, rpm, tokens, key_concurrent or 0, key_per_minute or 0, key_weekly_tokens or 0)
        return found if found != NO_LIMITS else None

    return limits


NO_LIMITS = Limits()
# Beyond a snapshot's age limit, how far ahead it looks for a booking that begins (its read's time).
UPCOMING_MARGIN_SECONDS = 2.0


def _read_snapshot() -> Snapshot:
    from channels_app.models import LLMModel, ModelAlias
    from gateway.models import ApiKey
    from reservations.models import GroupPolicy, Profile

    # Its age counts from here, before the first query: a read that a slow or restarting
    # database holds up is as old as its data, not as new as its end.
    read_from = time.monotonic()
    now = timezone.now()
    _limits = limits_reader()
    keys = ApiKey.objects.live()  # an expired key is known, to be told it expired
    scopes_m: dict[int, set[str]] = defaultdict(set)
    for key_id, name in ApiKey.models_allowed.through.objects.values_list("apikey_id", "llmmodel__name"):
        scopes_m[key_id].add(name)
    scopes_c: dict[int, set[int]] = defaultdict(set)
    scope_names: dict[int, set[str]] = defaultdict(set)
    for key_id, channel_id, channel_name in ApiKey.channels_allowed.through.objects.values_list(
        "apikey_id", "channel_id", "channel__name"
    ):
        scopes_c[key_id].add(channel_id)
        scope_names[key_id].add(channel_name)
    zones = {
        user_id: zone_named(name) for user_id, name in Profile.objects.values_list("user_id", "time_zone")
    }
    # Each user's share in a busy channel's fair queue: their groups' largest weight.
    weights: dict[int, int] = {}
    for user_id, weight in GroupPolicy.objects.filter(share_weight__gt=1).values_list(
        "group__user", "share_weight"
    ):
        if user_id is not None:
            weights[user_id] = max(weight, weights.get(user_id, 1))
    # A member of a group that turned loads on demand off causes none.
    no_loads = set(GroupPolicy.objects.filter(loads_on_demand=False).values_list("group__user", flat=True))
    callers = {
        hashed: Caller(
            user_id,
            username,
            key_id,
            wait,
            _limits(user_id, key_conc, key_rpm, key_tokens),
            staff,
            weights.get(user_id, 1),
            zones.get(user_id, UTC),
            frozenset(scopes_m[key_id]) if key_id in scopes_m else None,
            frozenset(scopes_c[key_id]) if key_id in scopes_c else None,
            expires,
            frozenset(scope_names[key_id]),
            user_id not in no_loads,
        )
        for (
            key_id,
            hashed,
            user_id,
            username,
            wait,
            key_conc,
            key_rpm,
            key_tokens,
            staff,
            expires,
        ) in keys.values_list(
            "pk",
            "hashed",
            "user_id",
            "user__username",
            "wait_seconds",
            "max_concurrent",
            "requests_per_minute",
            "weekly_tokens",
            "user__is_staff",
            "expires_at",
        )
    }
    # The active booking of each channel, and the next one if it begins within the snapshot's
    # life (its age limit and a read's time): the gateway lets its booker alone in from its
    # first moment (``access.as_of``), not from the next snapshot.
    views = channel_views(now)
    aliases = dict(ModelAlias.objects.values_list("name", "model__name"))
    loadable = frozenset(LLMModel.objects.filter(loads_on_demand=True).values_list("name", flat=True))
    return Snapshot(
        callers=callers, channels=views, aliases=aliases, taken_at=read_from, on_demand_models=loadable
    )


def channel_views(now: datetime) -> tuple[ChannelView, ...]:
    """Every channel as the gateway sees it at ``now``: what runs, its booking, its node."""
    from channels_app.models import Channel
    from channels_app.scheduling import selectors
    from reservations.models import Reservation
    from slotserve_base.target import Target

    soon = now + timedelta(
        seconds=float(settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS) + UPCOMING_MARGIN_SECONDS
    )
    active: dict[int, Booking] = {}
    upcoming: dict[int, Booking] = {}
    approved = (
        Reservation.objects.filter(status="approved", start__lte=soon, end__gt=now)
        .select_related("channel")
        .order_by("start")
    )
    for r in approved:
        booking = Booking(
            r.pk,
            r.user_id,
            r.exclusive,
            r.end,
            None if r.exclusive or r.model_id is None else (r.model_id, r.preset_id),
            r.start,
            lends=r.lend and r.channel.lend_while_idle and not r.exclusive,
        )
        if r.start <= now:
            active[r.channel_id] = booking
        else:
            upcoming.setdefault(r.channel_id, booking)
    channels = list(
        Channel.objects.select_related("runtime__model", "runtime__load", "target__model", "node")
    )
    wanted: set[tuple[int, Target]] = set()
    for channel in channels:
        runtime, target = channel.runtime_or_none(), channel.target_or_none()
        if runtime is not None and runtime.model_id is not None:
            wanted.add((channel.node_id, Target(runtime.model_id, runtime.preset_id)))
        if target is not None and target.model_id is not None:
            wanted.add((channel.node_id, Target(target.model_id, target.preset_id)))
    estimates = selectors.load_estimates(wanted)
    queueing = settings.SLOTSERVE_FAIR_QUEUE
    views = []
    for channel in channels:
        runtime, target = channel.runtime_or_none(), channel.target_or_none()
        running = Target(runtime.model_id, runtime.preset_id) if runtime and runtime.model_id else None
        heading = Target(target.model_id, target.preset_id) if target and target.model_id else None
        upstream = None
        if runtime is not None and runtime.port and runtime.phase in SERVING_PHASES:
            upstream = f"http://{url_host(runtime.host)}:{runtime.port}"
        views.append(
            ChannelView(
                id=channel.pk,
                name=channel.name,
                phase=runtime.phase if runtime else Phase.STOPPED,
                model=runtime.model.name if runtime and runtime.model else None,
                upstream=upstream,
                since=runtime.since if runtime else now,
                load_seconds=estimates.get((channel.node_id, running), 0.0) if running else 0.0,
                next_load_seconds=estimates.get((channel.node_id, heading), 0.0) if heading else 0.0,
                drain_seconds=settings.SLOTSERVE_DRAIN_SECONDS,
                stop_seconds=settings.SLOTSERVE_STOP_TIMEOUT_SECONDS,
                retry_at=runtime.retry_at if runtime else None,
                running=(running.model_id, running.preset_id) if running else None,
                fallback=bool(runtime and runtime.fallback),
                switching=False,
                booking=active.get(channel.pk),
                upcoming=upcoming.get(channel.pk),
                targets_model=target.model.name if target and target.model else None,
                on_demand=bool(target and target.reason == Reason.ON_DEMAND),
                ready_at=runtime.since.timestamp() if runtime and runtime.phase == Phase.READY else 0.0,
                upstream_key=runtime.api_secret if upstream is not None and runtime else "",
                places=runtime.places if upstream is not None and runtime and queueing else None,
                node=channel.node.name,
                node_ready=channel.node.is_ready(now),
                crashed=bool(
                    runtime and runtime.phase == Phase.FAILED and runtime.load and runtime.load.succeeded
                ),
            )
        )
    return tuple(views)


# The least time between two reads for news of a change (docs/gateway.md, "News of a change").
NEWS_READ_EVERY = 0.02

# How long a request waits for a fresh snapshot before it is told the database is away.
SNAPSHOT_TIMEOUT_SECONDS = 5.0


class SnapshotCache:
    """The current snapshot, kept fresh by a background task while requests come in.

    The task starts a new read well before the snapshot reaches its age limit
    (by twice the last read's time, at least a quarter of the limit), so
    requests never wait for the database in steady traffic, and the reading
    (some milliseconds of Python holding the GIL) falls at its own times, not at
    the start of a request. A request waits only when the snapshot is past its
    limit: the first one, or the first after a minute without requests, when
    the task has stopped.
    """

    IDLE_STOP = 60.0

    def __init__(self, max_age: float) -> None:
        self.max_age = max_age
        self.current = Snapshot()
        self.last_used = 0.0
        self.read_seconds = 0.0  # how long the last read took
        self.read_ended = 0.0  # when it ended (a snapshot is as old as its read's start)
        self.news_read_at = 0.0  # when the last read for news began
        self._lock = asyncio.Lock()
        self._keeper: asyncio.Future[None] | None = None
        self._read = asyncio.Event()  # set, and replaced, as each read ends

    async def get(self) -> Snapshot:
        snapshot = self.fresh()
        if snapshot is None:
            await self._refresh(asked_at=time.monotonic())
            snapshot = self.current
        return snapshot

    async def next_read(self) -> None:
        """Until the next read ends: a held request looks again at once, not at its next poll."""
        await self._read.wait()

    def fresh(self) -> Snapshot | None:
        """``get`` without waiting: the snapshot if it is within its age limit, else None."""
        now = self.last_used = time.monotonic()
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.ensure_future(self._keep_fresh())
        return self.current if now - self.current.taken_at < self.max_age else None

    def _lead(self) -> float:
        """How long before the age limit the keeper starts a read: twice the last read's time,
        at least a quarter of the limit and at most three quarters (a slow database is read
        early enough, a fast one not needlessly often)."""
        return min(max(self.max_age / 4, 2 * self.read_seconds), self.max_age * 3 / 4)

    async def _refresh(self, asked_at: float | None = None, news_at: float | None = None) -> None:
        async with self._lock:
            if asked_at is not None and self.read_ended >= asked_at:
                return  # a read ended while this request waited: its snapshot is the newest there is
            if news_at is not None:
                stale = self.current.taken_at < news_at  # read before the news arrived
            else:
                stale = time.monotonic() - self.current.taken_at >= self.max_age - self._lead()
            if stale:
                from asgiref.sync import sync_to_async

                try:
                    # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation
                    # that arrives as the read ends, and the keeper would never stop.
                    async with asyncio.timeout(SNAPSHOT_TIMEOUT_SECONDS):
                        started = time.monotonic()
                        self.current = await sync_to_async(read_snapshot, thread_sensitive=False)()
                        self.read_ended = time.monotonic()
                        self.read_seconds = self.read_ended - started
                        self._read.set()
                        self._read = asyncio.Event()
                except TimeoutError:
                    # Requests wait on this read: a database that does not answer gets them a
                    # 503 naming it, not a hang (the read's thread gives up by itself later).
                    raise DatabaseError(
                        f"the database did not answer within {SNAPSHOT_TIMEOUT_SECONDS:g} s"
                    ) from None

    async def _heard(self, at: float) -> None:
        """News of a change (``gateway.admit.news``): read anew now, unless a read began since.
        Reads for news come no oftener than ``NEWS_READ_EVERY`` and take no more than a quarter
        of the time: a storm of news (every channel of a lab switching at the hour) is read in
        a few reads, each covering every message that came before it."""
        wait = self.news_read_at + max(NEWS_READ_EVERY, 4 * self.read_seconds) - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        if self.current.taken_at >= at:
            return
        self.news_read_at = time.monotonic()
        try:
            await self._refresh(news_at=at)
        except Exception:  # the age limit still holds
            log.warning("the gateway could not read the news of a change", exc_info=True)

    async def _keep_fresh(self) -> None:
        from gateway.admit.news import listen

        listening = asyncio.ensure_future(listen(self._heard))
        try:
            await self._keep_fresh_by_age()
        finally:
            listening.cancel()

    async def _keep_fresh_by_age(self) -> None:
        while time.monotonic() - self.last_used < self.IDLE_STOP:
            age = time.monotonic() - self.current.taken_at
            await asyncio.sleep(max(self.max_age - self._lead() - age, 0.001))
            try:
                await self._refresh()
            except Exception:  # the next request past the limit retries, and reports what is wrong
                log.warning("the gateway could not refresh its snapshot", exc_info=True)
                await asyncio.sleep(self.max_age)
