"""Reads that gather the scheduling decision's inputs from the database.

The tick asks for every channel at once, so each read here is one query for
all channels: the number of queries does not grow with the number of
channels or reservations.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F, OuterRef, Q, QuerySet, Subquery, Window
from django.db.models.functions import RowNumber

from channels_app.models import Channel, LLMModel, LoadRecord, Node, OnDemandLoad, Override, Preset
from channels_app.scheduling.decision import (
    DecisionInput,
    OnDemandFacts,
    OverrideFacts,
    SchedulingSettings,
    Slot,
)
from channels_app.scheduling.load_estimates import (
    MARGIN_LOADS,
    RECENT_LOADS,
    LoadEstimate,
    LoadHistory,
    estimate_load,
    read_speed_mbps,
)
from channels_app.scheduling.prewarm import Upcoming
from reservations.models import SCHEDULED_STATUSES, Reservation, ReservationStatus
from slotserve_base.target import Target


def scheduling_settings() -> SchedulingSettings:
    return SchedulingSettings(
        min_preload_seconds=settings.SLOTSERVE_MIN_PRELOAD_SECONDS,
        switch_buffer_seconds=settings.SLOTSERVE_SWITCH_BUFFER_SECONDS,
        stop_timeout_seconds=settings.SLOTSERVE_STOP_TIMEOUT_SECONDS,
    )


@dataclass(frozen=True)
class ChannelFacts:
    """A channel with the decision's inputs for it."""

    channel: Channel
    decision_input: DecisionInput
    # The estimate of each target in ``decision_input.load_seconds`` with what it was made from.
    estimates: Mapping[Target, LoadEstimate] = field(default_factory=dict)


def load_estimates(wanted: Iterable[tuple[int, Target]]) -> dict[tuple[int, Target], float]:
    """The load estimate (docs/scheduling.md) of each ``(node id, target)`` pair, in seconds."""
    return {key: estimate.seconds for key, estimate in load_estimate_details(wanted).items()}


def load_estimate_details(
    wanted: Iterable[tuple[int, Target]], sizes: Mapping[int, int] | None = None
) -> dict[tuple[int, Target], LoadEstimate]:
    """Each ``(node id, target)`` pair's estimate with what it was made from, in three queries
    (two when the caller read the models' ``sizes``)."""
    wanted = set(wanted)
    if not wanted:
        return {}
    model_ids = {target.model_id for _, target in wanted}
    node_ids = {node_id for node_id, _ in wanted}
    if sizes is None or not model_ids <= sizes.keys():
        sizes = dict(LLMModel.objects.filter(pk__in=model_ids).values_list("pk", "size_bytes"))
    # Each model + preset's last five loads on every node, newest first.
    loads: dict[int, list[tuple[int, int | None, datetime, float]]] = defaultdict(list)
    for node_id, model_id, preset_id, started, finished in _latest(
        LoadRecord.objects.filter(model_id__in=model_ids), ["model_id", "preset_id", "node_id"], RECENT_LOADS
    ).values_list("node_id", "model_id", "preset_id", "started", "finished"):
        if finished is not None:  # excluded by the query; keeps the types honest
            loads[model_id].append((node_id, preset_id, finished, (finished - started).total_seconds()))
    # Each node's last loads of any model: its read speed and its misses.
    sized: dict[int, list[tuple[int, float]]] = defaultdict(list)
    shortfalls: dict[int, list[float]] = defaultdict(list)
    for node_id, size, started, finished, estimated in _latest(
        LoadRecord.objects.filter(node_id__in=node_ids), ["node_id"], MARGIN_LOADS
    ).values_list("node_id", "model__size_bytes", "started", "finished", "estimated_seconds"):
        if finished is None:
            continue
        took = (finished - started).total_seconds()
        sized[node_id].append((size, took))
        if estimated is not None:
            shortfalls[node_id].append(took - estimated)

    def history(node_id: int, target: Target) -> LoadHistory:
        def newest(here: bool, same_preset: bool) -> list[float]:
            chosen = [
                (finished, seconds)
                for node, preset, finished, seconds in loads.get(target.model_id, [])
                if (node == node_id) == here and (preset == target.preset_id or not same_preset)
            ]
            return [seconds for _, seconds in sorted(chosen, key=lambda pair: pair[0], reverse=True)]

        return LoadHistory(
            size_bytes=sizes.get(target.model_id, 0),
            preset_here=newest(here=True, same_preset=True),
            model_here=newest(here=True, same_preset=False),
            preset_elsewhere=newest(here=False, same_preset=True),
            model_elsewhere=newest(here=False, same_preset=False),
            node_read_mbps=read_speed_mbps(sized.get(node_id, [])),
            node_shortfalls=shortfalls.get(node_id, []),
        )

    mbps = settings.SLOTSERVE_DISK_READ_MBPS
    return {
        (node_id, target): estimate_load(history(node_id, target), disk_read_mbps=mbps)
        for node_id, target in wanted
    }


def _latest(loads: QuerySet[LoadRecord], partition: list[str], count: int) -> QuerySet[LoadRecord]:
    """The ``count`` newest successful loads of each partition."""
    return (
        loads.filter(succeeded=True, finished__isnull=False)
        .annotate(
            recency=Window(RowNumber(), partition_by=[F(f) for f in partition], order_by=F("finished").desc())
        )
        .filter(recency__lte=count)
    )


def _override_facts(channel: Channel) -> OverrideFacts | None:
    try:
        override: Override = channel.override
    except Override.DoesNotExist:
        return None
    return OverrideFacts(target=override.target, until=override.until, set_at=override.set_at)


def _running(channel: Channel) -> Target | None:
    runtime = channel.runtime_or_none()
    return runtime.running if runtime is not None else None


def on_demand_facts(channel_ids: Iterable[int]) -> dict[int, OnDemandFacts]:
    """The active load on demand of each of the channels that has one."""
    rows = OnDemandLoad.objects.filter(released_at__isnull=True, channel_id__in=list(channel_ids))
    return {
        channel_id: OnDemandFacts(Target(model_id, preset_id), since)
        for channel_id, model_id, preset_id, since in rows.values_list(
            "channel_id", "model_id", "preset_id", "started_at"
        )
    }


def _build_inputs(
    channels: Sequence[Channel], slots_by_channel: dict[int, list[Slot]]
) -> dict[int, ChannelFacts]:
    wanted: set[tuple[int, Target]] = set()
    on_demand = on_demand_facts(c.pk for c in channels)
    for channel in channels:
        targets = [slot.target for slot in slots_by_channel.get(channel.pk, [])]
        targets.append(channel.default_target)
        if channel.pk in on_demand:
            targets.append(on_demand[channel.pk].target)
        wanted.update((channel.node_id, t) for t in targets if t is not None)
    estimates = load_estimate_details(wanted)
    config = scheduling_settings()
    facts: dict[int, ChannelFacts] = {}
    for channel in channels:
        mine = {t: e for (node_id, t), e in estimates.items() if node_id == channel.node_id}
        loads = {t: e.seconds for t, e in mine.items()}
        facts[channel.pk] = ChannelFacts(
            channel=channel,
            estimates=mine,
            decision_input=DecisionInput(
                default=channel.default_target,
                slots=tuple(slots_by_channel.get(channel.pk, [])),
                override=_override_facts(channel),
                running=_running(channel),
                on_demand=on_demand.get(channel.pk),
                load_seconds=loads,
                settings=config,
            ),
        )
    return facts


def _slot_rows(reservations: QuerySet[Reservation]) -> dict[int, list[Slot]]:
    slots: dict[int, list[Slot]] = defaultdict(list)
    rows = reservations.values_list(
        "pk", "channel_id", "start", "end", "model_id", "preset_id", "exclusive", "status"
    )
    for pk, channel_id, start, end, model_id, preset_id, exclusive, status in rows:
        target = None if exclusive or model_id is None else Target(model_id, preset_id)
        slots[channel_id].append(
            Slot(id=pk, start=start, end=end, target=target, counts=status in SCHEDULED_STATUSES)
        )
    return slots


def _channels(channel_ids: Iterable[int] | None) -> QuerySet[Channel]:
    channels = Channel.objects.select_related("override", "runtime", "target")
    if channel_ids is not None:
        channels = channels.filter(pk__in=list(channel_ids))
    return channels


def decision_inputs(*, now: datetime, channel_ids: Iterable[int] | None = None) -> dict[int, ChannelFacts]:
    """The inputs of every channel's decision at ``now`` (or of the given channels).

    Per channel only two reservations matter at ``now``: the latest one that
    started (it is the active one if any, and tells whether an override has
    been cut) and the next approved one. The database picks them.
    """
    scheduled = Reservation.objects.scheduled()
    latest_started = scheduled.filter(channel=OuterRef("pk"), start__lte=now).order_by("-start")
    upcoming = scheduled.filter(
        channel=OuterRef("pk"), start__gt=now, status=ReservationStatus.APPROVED
    ).order_by("start")
    picked = _channels(channel_ids).annotate(
        latest_id=Subquery(latest_started.values("pk")[:1]),
        next_id=Subquery(upcoming.values("pk")[:1]),
    )
    channels = list(picked)
    slots = _slot_rows(
        Reservation.objects.filter(Q(pk__in=picked.values("latest_id")) | Q(pk__in=picked.values("next_id")))
    )
    return _build_inputs(channels, slots)


def channel_window_inputs(*, channel: Channel, start: datetime, end: datetime) -> DecisionInput:
    """The inputs of one channel's decisions for any moment in ``[start, end]``
    (``channels_window_inputs`` for one channel)."""
    return channels_window_inputs(channel_ids=[channel.pk], start=start, end=end)[channel.pk]


def channels_window_inputs(
    *, channel_ids: Iterable[int], start: datetime, end: datetime
) -> dict[int, DecisionInput]:
    """The inputs of each channel's decisions for any moment in ``[start, end]``, in a fixed
    number of queries however many channels and bookings (the calendar plans every channel it
    shows).

    Holds every scheduled reservation that overlaps the window, the latest one that started
    before it, and the next approved one after it.
    """
    scheduled = Reservation.objects.scheduled()
    latest = scheduled.filter(channel=OuterRef("pk"), start__lte=start).order_by("-start")
    after = scheduled.filter(
        channel=OuterRef("pk"), start__gt=end, status=ReservationStatus.APPROVED
    ).order_by("start")
    picked = _channels(channel_ids).annotate(
        latest_id=Subquery(latest.values("pk")[:1]), next_id=Subquery(after.values("pk")[:1])
    )
    channels = list(picked)
    ids = [c.pk for c in channels]
    reservations = scheduled.filter(channel_id__in=ids).filter(
        Q(start__lte=end, end__gt=start)
        | Q(pk__in=[c.latest_id for c in channels if c.latest_id])
        | Q(pk__in=[c.next_id for c in channels if c.next_id])
    )
    facts = _build_inputs(channels, _slot_rows(reservations))
    return {pk: fact.decision_input for pk, fact in facts.items()}


def preset_load_estimates() -> dict[tuple[int, int | None, int], float]:
    """The estimate the scheduler uses for every model, each of its presets (and none), on every
    node: ``(model id, preset id, node id) → seconds``."""
    return {key: estimate.seconds for key, estimate in preset_load_estimate_details().items()}


def preset_load_estimate_details() -> dict[tuple[int, int | None, int], LoadEstimate]:
    """``preset_load_estimates`` with what each was made from."""
    nodes = list(Node.objects.values_list("pk", flat=True)) or [0]
    targets = [Target(m) for m in LLMModel.objects.values_list("pk", flat=True)]
    targets += [Target(m, p) for p, m in Preset.objects.values_list("pk", "model_id")]
    estimates = load_estimate_details((n, t) for n in nodes for t in targets)
    return {(t.model_id, t.preset_id, n): estimate for (n, t), estimate in estimates.items()}


def model_load_estimates() -> dict[int, float]:
    """Each model's slowest estimate over its presets and the nodes: what to expect at worst.

    A model not yet loaded anywhere gets the size-based first estimate.
    """
    result: dict[int, float] = {}
    for (model_id, _, _), seconds in preset_load_estimates().items():
        result[model_id] = max(seconds, result.get(model_id, 0.0))
    return result


@dataclass(frozen=True)
class BookedSpan:
    """A booking that holds its slot (pending or approved), as placement reads it."""

    channel_id: int
    start: datetime
    end: datetime
    model_id: int
    preset_id: int | None
    exclusive: bool


def booked_spans(
    *, start: datetime, end: datetime, channel_ids: Iterable[int] | None = None
) -> list[BookedSpan]:
    """The bookings holding their slot that overlap ``[start, end)``, on the given channels or all.

    The scheduler is the one part of ``channels_app`` that reads bookings (docs/architecture.md):
    placement and the inventory ask here."""
    held = Reservation.objects.blocking().filter(start__lt=end, end__gt=start)
    if channel_ids is not None:
        held = held.filter(channel__in=list(channel_ids))
    fields = ("channel_id", "start", "end", "model_id", "preset_id", "exclusive")
    return [BookedSpan(*row) for row in held.values_list(*fields)]


def channels_booked_with(*, model: LLMModel | None, preset: Preset | None, after: datetime) -> set[int]:
    """Channels with a booking of ``model`` or ``preset`` that holds its slot and ends after ``after``."""
    ahead = Reservation.objects.blocking().filter(end__gt=after)
    uses = Q(preset=preset) if preset is not None else Q(pk__in=[])
    if model is not None:
        uses |= Q(model=model)
    return set(ahead.filter(uses).values_list("channel_id", flat=True))


def upcoming_bookings(*, node_name: str, now: datetime, horizon: timedelta) -> list[Upcoming]:
    """Each of the node's channels' next approved booking of a model that starts within
    ``horizon``, with its model's file and what the channel runs and is decided to run."""
    channels = list(_channels(None).filter(node__name=node_name))
    if not channels:
        return []
    soonest = (
        Reservation.objects.filter(
            channel=OuterRef("pk"),
            status=ReservationStatus.APPROVED,
            start__gt=now,
            exclusive=False,
            model__isnull=False,
        )
        .order_by("start")
        .values("pk")[:1]
    )
    next_ids = {
        pk: booking_id
        for pk, booking_id in Channel.objects.filter(pk__in=[c.pk for c in channels])
        .annotate(booking_id=Subquery(soonest))
        .values_list("pk", "booking_id")
        if booking_id is not None
    }
    bookings = Reservation.objects.filter(pk__in=next_ids.values(), start__lte=now + horizon).select_related(
        "model"
    )
    by_channel = {c.pk: c for c in channels}
    upcoming: list[Upcoming] = []
    for booking in bookings:
        if booking.model is None:  # excluded by the query; keeps the types honest
            continue
        channel = by_channel[booking.channel_id]
        decided = getattr(channel, "target", None)
        upcoming.append(
            Upcoming(
                channel_id=channel.pk,
                booking_id=booking.pk,
                start=booking.start,
                target=Target(booking.model.pk, booking.preset_id),
                path=booking.model.path,
                size_bytes=booking.model.size_bytes,
                running=_running(channel),
                decided=Target(decided.model_id, decided.preset_id) if decided and decided.model_id else None,
            )
        )
    return upcoming


def booked_targets(channel_id: int, start: datetime, end: datetime) -> set[Target]:
    """The models and presets of the channel's approved bookings that begin in ``[start, end)``."""
    found = Reservation.objects.filter(
        channel_id=channel_id,
        status=ReservationStatus.APPROVED,
        start__gte=start,
        start__lt=end,
        model__isnull=False,
    ).values_list("model_id", "preset_id")
    return {Target(model_id, preset_id) for model_id, preset_id in found}
