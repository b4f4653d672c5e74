"""Portal pages that show things: overview, calendar, models."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, tzinfo
from pathlib import Path
from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import Group, User
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from channels_app.models import Channel, LLMModel, ModelFile, Node, Preset
from channels_app.scheduling import selectors
from channels_app.scheduling.decision import PlanSegment
from channels_app.scheduling.selectors import preset_load_estimates
from channels_app.scheduling.services import plans_for
from portal.channel_reasons import BookingFacts, why
from portal.forms import OverrideForm
from reservations.hints import adjacent_switch_minutes, memory_estimate
from reservations.models import Reservation, ReservationStatus
from reservations.wording import slot_words
from slotserve_base.target import Target
from slotserve_base.vocabulary import Phase, Reason

PRELOADING = {Reason.PRELOAD_NEXT, Reason.SKIP_DEFAULT_SHORT_GAP, Reason.STOP_FOR_EXCLUSIVE}
MANUAL = {Reason.MANUAL_OVERRIDE, Reason.MANUAL_UNLOAD}


@dataclass
class ChannelCard:
    channel: Channel
    ready: bool
    phase: str
    running: str
    why: str
    active: Reservation | None
    error: str
    fallback: bool
    retry_at: datetime | None
    loading_elapsed: int | None = None
    loading_estimate: int | None = None
    override_form: OverrideForm | None = None
    override_selects: tuple[SafeString, SafeString] | None = None  # its model and preset lists


def _label(model: LLMModel | None, preset: Preset | None) -> str:
    if model is None:
        return "—"
    return f"{model.name} / {preset.name}" if preset else model.name


def channel_cards(*, now: datetime, staff: bool) -> list[ChannelCard]:
    channels = Channel.objects.select_related(
        "node",
        "runtime__model",
        "runtime__preset",
        "target__reservation__user",
    ).prefetch_related("node__gpus")
    active = {
        r.channel_id: r for r in Reservation.objects.active_at(now).select_related("user", "model", "preset")
    }
    tz = timezone.get_current_timezone()
    cards = []
    loading: list[tuple[ChannelCard, Target]] = []
    selects = OverrideForm.shared_selects() if staff else None
    for channel in channels:
        runtime, target = channel.runtime_or_none(), channel.target_or_none()
        booking = None
        if target is not None and target.reservation is not None:
            r = target.reservation
            booking = BookingFacts(user=r.user.username, start=r.start, end=r.end)
        reason = (runtime and runtime.fallback and "fallback_default") or (target.reason if target else None)
        card = ChannelCard(
            channel=channel,
            ready=channel.node.is_ready(now),
            phase=runtime.phase if runtime else Phase.STOPPED,
            running=_label(runtime.model, runtime.preset) if runtime else "—",
            why=why(
                reason=reason, booking=booking, valid_until=target.valid_until if target else None, tz=tz
            ),
            active=active.get(channel.pk),
            error=runtime.error if runtime else "",
            fallback=bool(runtime and runtime.fallback),
            retry_at=runtime.retry_at if runtime else None,
            override_form=OverrideForm(prefix=f"ch{channel.pk}") if selects else None,
            override_selects=selects.for_prefix(f"ch{channel.pk}") if selects else None,
        )
        if runtime is not None and runtime.phase == Phase.LOADING and runtime.model_id is not None:
            card.loading_elapsed = int((now - runtime.since).total_seconds())
            loading.append((card, Target(runtime.model_id, runtime.preset_id)))
        cards.append(card)
    if loading:
        estimates = selectors.load_estimates((c.channel.node_id, t) for c, t in loading)
        for card, target_ in loading:
            card.loading_estimate = int(estimates[(card.channel.node_id, target_)])
    return cards


def _viewer(request: HttpRequest) -> User:
    """The signed-in user of a page behind ``login_required``."""
    assert isinstance(request.user, User), "view needs login_required"
    return request.user


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    cards = channel_cards(now=timezone.now(), staff=request.user.is_staff)
    template = "portal/_channel_cards.html" if request.GET.get("partial") else "portal/overview.html"
    return render(request, template, {"cards": cards, "now": timezone.now()})


@dataclass
class Block:
    """Something placed on the timeline, in percent of the row's width."""

    left: float
    width: float
    css: str
    label: str
    title: str
    details: dict[str, Any] | None = None  # a booking's, shown when it is clicked


@dataclass
class CalendarRow:
    channel: Channel
    blocks: list[Block] = field(default_factory=list)
    plan: list[Block] = field(default_factory=list)


def _place(start: datetime, end: datetime, origin: datetime, span: timedelta) -> tuple[float, float] | None:
    lo, hi = max(start, origin), min(end, origin + span)
    if hi <= lo:
        return None
    return (lo - origin) / span * 100, (hi - lo) / span * 100


def calendar_rows(
    *,
    lanes: list[tuple[datetime, timedelta]],
    now: datetime,
    viewer: User,
    channel_id: int | None = None,
    node_id: int | None = None,
    model_id: int | None = None,
    group_id: int | None = None,
    channel_slice: slice | None = None,
) -> list[list[CalendarRow]]:
    """The timeline's rows for each lane (a day: its start and length); with filters, only the
    channel, the node's channels, or the blocks of one model (and the channels that have them or
    default to it); ``channel_slice``: a page of the channels, in name order. One read of the
    bookings, plans and load estimates for all the lanes, in a number of queries that does not
    grow with the channels or the bookings shown."""
    tz = timezone.get_current_timezone()
    first, last = lanes[0][0], max(origin + span for origin, span in lanes)
    shown = Reservation.objects.exclude(status__in=[ReservationStatus.REJECTED, ReservationStatus.CANCELLED])
    if model_id is not None:
        shown = shown.filter(model_id=model_id)
    if group_id is not None:
        shown = shown.filter(user__groups__id=group_id)
    listed = Channel.objects.all()
    if channel_id is not None:
        listed = listed.filter(pk=channel_id)
    if node_id is not None:
        listed = listed.filter(node_id=node_id)
    listed = listed.order_by("name")
    if channel_slice is not None:
        listed = listed[channel_slice]
    channels = list(
        listed.select_related("node").prefetch_related(
            Prefetch(
                "reservations",
                queryset=shown.overlapping(first, last)
                .select_related("user", "model", "preset")
                .order_by("start"),
                to_attr="shown",
            )
        )
    )
    names = dict(LLMModel.objects.values_list("pk", "name"))
    plans = plans_for(channel_ids=[c.pk for c in channels], now=now, start=max(first, now), end=last)
    estimates = selectors.load_estimates(
        (c.node_id, r.target) for c in channels for r in c.shown if r.target is not None
    )
    shown_on = {c.pk: list(c.shown) for c in channels}
    return [
        _lane_rows(origin, span, channels, shown_on, plans, estimates, names, viewer, tz, model_id, group_id)
        for origin, span in lanes
    ]


def _lane_rows(
    origin: datetime,
    span: timedelta,
    channels: Sequence[Channel],
    shown_on: dict[int, list[Reservation]],
    plans: dict[int, list[PlanSegment]],
    estimates: dict[tuple[int, Target], float],
    names: dict[int, str],
    viewer: User,
    tz: tzinfo,
    model_id: int | None,
    group_id: int | None,
) -> list[CalendarRow]:
    """One lane's rows, from what ``calendar_rows`` read for all of them."""
    end = origin + span
    rows = []
    for channel in channels:
        bookings = [r for r in shown_on[channel.pk] if r.start < end and r.end > origin]
        if model_id is not None and not bookings and channel.default_model_id != model_id:
            continue
        if group_id is not None and not bookings:
            continue
        row = CalendarRow(channel)
        previous: Reservation | None = None
        for r in bookings:
            place = _place(r.start, r.end, origin, span)
            if place is None:
                continue
            what = "whole card" if r.exclusive else _label(r.model, r.preset)
            mine = r.user_id == viewer.pk
            css = f"res {r.status}" + (" mine" if mine else "") + (" exclusive" if r.exclusive else "")
            local = slot_words(r.start, r.end, tz)
            waiting = r.status == ReservationStatus.PENDING
            label = ("pending: " if waiting else "") + f"{r.user.username}: {what}"
            title = f"{r.user.username}, {local} {what}" + (" (pending approval)" if waiting else "")
            details = {
                "who": r.user.username,
                "what": what,
                "when": local,
                "status": "pending approval" if waiting else r.status,
                "mine": mine,
                "channel": channel.name,
            }
            row.blocks.append(Block(*place, css, label, title, details))
            if previous is not None and previous.target != r.target and r.target is not None:
                lost = adjacent_switch_minutes(
                    load_seconds=estimates[(channel.node_id, r.target)],
                    gap_seconds=(r.start - previous.end).total_seconds(),
                )
                lost_place = (
                    _place(r.start, r.start + timedelta(minutes=lost), origin, span) if lost else None
                )
                if lost_place:
                    row.blocks.append(Block(*lost_place, "lost", "", f"about {lost} min lost to loading"))
            previous = r
        for segment in plans.get(channel.pk, []):
            if segment.reason not in PRELOADING | MANUAL:
                continue
            place = _place(segment.start, segment.end, origin, span)
            if place is None:
                continue
            model = names.get(segment.target.model_id, "nothing") if segment.target else "nothing"
            kind = "manual" if segment.reason in MANUAL else "preload"
            title = f"{segment.reason.replace('_', ' ')}: {model} from {segment.start.astimezone(tz):%H:%M}"
            row.plan.append(Block(*place, kind, "", title))
        rows.append(row)
    return rows


def _number(raw: str | None) -> int | None:
    return int(raw) if raw and raw.isdigit() and len(raw) < 12 else None


# The calendar shows days of years that a booking can be in (slotserve_base.api_fields).
FIRST_DAY, LAST_DAY = date(1970, 1, 8), date(8999, 12, 24)


def _day(raw: str | None, today: date) -> date:
    """The day asked for; today when it is not a day, the nearest shown one at the ends of time."""
    try:
        day = date.fromisoformat(raw) if raw and len(raw) <= 10 else today
    except ValueError:
        return today
    return min(max(day, FIRST_DAY), LAST_DAY)


# The calendar shows this many channels a page: a week of two hundred would be a page of a
# megabyte, slow to make and to read. Filters (a node, a model) narrow the channels first.
CALENDAR_CHANNELS = 50


@login_required
def calendar(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    tz = timezone.get_current_timezone()
    week = request.GET.get("view") == "week"
    day = _day(request.GET.get("day"), timezone.localdate(now))
    if week:
        day -= timedelta(days=day.weekday())
    days = 7 if week else 1
    origin = timezone.make_aware(datetime.combine(day, time()), tz)
    # Hour ticks over one day: the week view shows each day as a lane of its own.
    ticks = [{"left": i / 24 * 100, "label": f"{i:02d}"} for i in range(24)]
    filters = {name: _number(request.GET.get(name)) for name in ("channel", "node", "model", "group")}
    days_shown = []
    for offset in range(days):
        lane_day = day + timedelta(days=offset)
        lane_origin = timezone.make_aware(datetime.combine(lane_day, time()), tz)
        # Between local midnights: a daylight-saving day is 23 or 25 hours.
        lane_end = timezone.make_aware(datetime.combine(lane_day + timedelta(days=1), time()), tz)
        days_shown.append((lane_day, lane_origin, lane_end - lane_origin))
    listed = Channel.objects.all()
    if filters["channel"] is not None:
        listed = listed.filter(pk=filters["channel"])
    if filters["node"] is not None:
        listed = listed.filter(node_id=filters["node"])
    pages = Paginator(listed.order_by("name").values_list("pk", flat=True), CALENDAR_CHANNELS)
    page = pages.get_page(request.GET.get("page"))
    all_rows = calendar_rows(
        lanes=[(lane_origin, lane_span) for _, lane_origin, lane_span in days_shown],
        now=now,
        viewer=_viewer(request),
        channel_id=filters["channel"],
        node_id=filters["node"],
        model_id=filters["model"],
        group_id=filters["group"],
        channel_slice=slice(page.start_index() - 1 if pages.count else 0, page.end_index()),
    )
    lanes: dict[int, dict[str, Any]] = {}
    for (lane_day, lane_origin, lane_span), rows in zip(days_shown, all_rows, strict=True):
        for row in rows:
            lane = lanes.setdefault(row.channel.pk, {"channel": row.channel, "days": []})
            lane["days"].append(
                {
                    "label": f"{lane_day:%a %d}",
                    "row": row,
                    "origin": lane_origin,
                    "span_seconds": lane_span.total_seconds(),
                    "now_left": (now - lane_origin) / lane_span * 100
                    if lane_origin <= now < lane_origin + lane_span
                    else None,
                }
            )
    context = {
        "lanes": list(lanes.values()),
        "filters": filters,
        "filter_query": "".join(f"&{k}={v}" for k, v in filters.items() if v is not None)
        + (f"&page={page.number}" if page.number > 1 else ""),
        "channel_page": page,
        "page_filters": "".join(f"&{k}={v}" for k, v in filters.items() if v is not None),
        "choices": {
            "channel": Channel.objects.values_list("pk", "name"),
            "node": Node.objects.values_list("pk", "name"),
            "model": LLMModel.objects.values_list("pk", "name"),
            "group": Group.objects.values_list("pk", "name"),
        },
        "origin": origin,
        "day": day,
        "week": week,
        "ticks": ticks,
        "previous": day - timedelta(days=days),
        "next": day + timedelta(days=days),
        "today": timezone.localdate(now),
    }
    return render(request, "portal/calendar.html", context)


@login_required
def run_log(request: HttpRequest, pk: int) -> HttpResponse:
    """The last lines of the channel's current or last run, as the process wrote them; the page
    then follows new lines live (``GET /api/channels/{id}/log?after=<cursor>``)."""
    from channels_app.node_agent.run_logs import recent_lines_with_cursor

    channel = get_object_or_404(Channel, pk=pk)
    lines, cursor = recent_lines_with_cursor(channel, 200)
    return render(request, "portal/run_log.html", {"channel": channel, "lines": lines, "cursor": cursor})


@login_required
def models_page(request: HttpRequest) -> HttpResponse:
    channels = list(Channel.objects.select_related("node").prefetch_related("node__gpus"))
    by_target = preset_load_estimates()
    node_names = dict(Node.objects.values_list("pk", "name"))

    def loads(model_id: int, preset_id: int) -> str:
        """The scheduler's estimate of this preset on each node, e.g. "here 500 s, there 65 s"."""
        found = sorted(
            (node_names.get(n, "?"), s)
            for (m, p, n), s in by_target.items()
            if (m, p) == (model_id, preset_id)
        )
        return ", ".join(f"{name} {round(seconds)} s" for name, seconds in found)

    rows = []
    for model in LLMModel.objects.prefetch_related("presets", "nodes"):
        worst = max((s for (m, _, _), s in by_target.items() if m == model.pk), default=0.0)
        rows.append(
            {
                "model": model,
                "estimate": round(worst),
                "presets": [
                    (p, " ".join(p.args_effective), memory_estimate(model, p), loads(model.pk, p.pk))
                    for p in model.presets.all()
                ],
                "exceeds": [c.name for c in channels if model.size_bytes > c.vram_bytes()],
                "present_on": [n.name for n in model.nodes.all()],
            }
        )
    registered = LLMModel.objects.values("path")
    unregistered = ModelFile.objects.exclude(path__in=registered).select_related("node")
    return render(request, "portal/models.html", {"rows": rows, "unregistered": unregistered})


@staff_member_required
@require_POST
def register_model_file(request: HttpRequest, pk: int) -> HttpResponse:
    """Register a model for a file a node worker found, named after the file."""
    found = get_object_or_404(ModelFile, pk=pk)
    name = Path(found.path).stem if found.backend == "llama.cpp" else Path(found.path).name
    if LLMModel.objects.filter(name=name).exists():
        messages.error(request, f"A model named {name} exists already; register this file in the admin.")
        return redirect("portal:models")
    model = LLMModel.objects.create(
        name=name, backend=found.backend, path=found.path, size_bytes=found.size_bytes
    )
    model.nodes.set(Node.objects.filter(model_files__path=found.path))
    messages.success(request, f"Model {name} registered; add presets for it in the admin or the API.")
    return redirect("portal:models")
