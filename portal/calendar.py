"""The calendar: each channel's day or week as a timeline of bookings, the planned loads
and the override, read in a number of queries that does not grow with the channels or the
bookings shown (50 channels a page)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime, time, timedelta, tzinfo
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import Group, User
from django.core.paginator import Paginator
from django.db.models import Prefetch, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from channels_app.models import Channel, LLMModel, Node
from channels_app.scheduling import selectors
from channels_app.scheduling.decision import PlanSegment
from channels_app.scheduling.services import plans_for
from portal.calendar_lanes import Block, CalendarRow, lane_html, placed
from portal.views import MANUAL, PRELOADING, target_label, viewer_of
from reservations.hints import adjacent_switch_minutes
from reservations.models import Blackout, Reservation, ReservationStatus
from reservations.profiles import profile_for
from reservations.wording import slot_words
from slotserve_base.api_fields import is_id
from slotserve_base.target import Target

# What the calendar reads of each booking it shows (with its booker's name, model and preset).
SHOWN_FIELDS = (
    "start", "end", "status", "exclusive", "lend", "channel_id", "user_id", "model_id", "preset_id",
    "user__username", "model__name", "preset__name",
)  # fmt: skip


def channels_listed(channel_id: int | None, node_id: int | None) -> QuerySet[Channel]:
    """The channels the calendar shows, in name order: one, or a node's, or all."""
    listed = Channel.objects.order_by("name")
    if channel_id is not None:
        listed = listed.filter(pk=channel_id)
    if node_id is not None:
        listed = listed.filter(node_id=node_id)
    return listed


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
    plans: bool = True,
) -> list[list[CalendarRow]]:
    """The timeline's rows for each lane (a day: its start and length); with filters, only the
    channel, the node's channels, or the blocks of one model (and the channels that have them or
    default to it); ``channel_slice``: a page of the channels, in name order. One read of the
    bookings, plans and load estimates for all the lanes, in a number of queries that does not
    grow with the channels or the bookings shown. ``plans`` False: the bookings and blackouts
    only (the agenda's list), without the preloads and the minutes lost to loading, which cost
    a scheduling plan per channel."""
    tz = timezone.get_current_timezone()
    first, last = lanes[0][0], max(origin + span for origin, span in lanes)
    shown = Reservation.objects.exclude(status__in=[ReservationStatus.REJECTED, ReservationStatus.CANCELLED])
    if model_id is not None:
        shown = shown.filter(model_id=model_id)
    if group_id is not None:
        shown = shown.filter(user__groups__id=group_id)
    listed = channels_listed(channel_id, node_id)
    if channel_slice is not None:
        listed = listed[channel_slice]
    channels = list(
        listed.select_related("node").prefetch_related(
            Prefetch(
                "reservations",
                queryset=shown.overlapping(first, last)
                .select_related("user", "model", "preset")
                .only(*SHOWN_FIELDS)
                .order_by("start"),
                to_attr="shown",
            )
        )
    )
    names = dict(LLMModel.objects.values_list("pk", "name"))
    if plans:
        planned = plans_for(channel_ids=[c.pk for c in channels], now=now, start=max(first, now), end=last)
        estimates = selectors.load_estimates(
            (c.node_id, r.target) for c in channels for r in c.shown if r.target is not None
        )
    else:
        planned, estimates = {}, {}
    shown_on = {c.pk: list(c.shown) for c in channels}
    blackouts = list(Blackout.objects.filter(start__lt=last, end__gt=first).prefetch_related("channels"))
    closed_on: dict[int, list[Blackout]] = {c.pk: [] for c in channels}
    for blackout in blackouts:
        named = {c.pk for c in blackout.channels.all()}
        for channel in channels:
            if not named or channel.pk in named:
                closed_on[channel.pk].append(blackout)
    return [
        _closed(
            _lane_rows(
                origin, span, channels, shown_on, planned, estimates, names, viewer, tz, model_id, group_id
            ),
            closed_on,
            origin,
            span,
            tz,
        )
        for origin, span in lanes
    ]


def _closed(
    rows: list[CalendarRow],
    closed_on: dict[int, list[Blackout]],
    origin: datetime,
    span: timedelta,
    tz: tzinfo,
) -> list[CalendarRow]:
    """The lane's rows with the blackouts of each channel placed on them."""
    for row in rows:
        for blackout in closed_on[row.channel.pk]:
            place = placed(blackout.start, blackout.end, origin, span)
            if place is not None:
                title = f"closed {slot_words(blackout.start, blackout.end, tz)}: {blackout.reason}"
                row.closed.append(Block(*place, "closed", f"closed: {blackout.reason}", title))
    return rows


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
            place = placed(r.start, r.end, origin, span)
            if place is None:
                continue
            what = "whole card" if r.exclusive else target_label(r.model, r.preset)
            mine = r.user_id == viewer.pk
            # A slot its booker lends (docs/gateway.md, "Lending"): others may use it while idle.
            lends = r.lend and channel.lend_while_idle and not r.exclusive
            css = (
                f"res {r.status}"
                + (" mine" if mine else "")
                + (" exclusive" if r.exclusive else "")
                + (" lends" if lends else "")
            )
            local = slot_words(r.start, r.end, tz)
            waiting = r.status == ReservationStatus.PENDING
            # Who on the first line ("yours" in words, not only in colour), what on the second:
            # both read in a two-hour block; the title (and the focus) has it whole.
            label = ("pending: " if waiting else "") + ("yours" if mine else r.user.username)
            short = "whole card" if r.exclusive else (r.model.name if r.model else what)
            lent = f"lent while {'you are' if mine else r.user.username + ' is'} idle"
            title = (
                f"{r.user.username}, {local} {what}"
                + (" (pending approval)" if waiting else "")
                + (f" ({lent})" if lends else "")
            )
            details = {
                "who": r.user.username,
                "what": what,
                "when": local,
                "status": "pending approval" if waiting else r.status,
                "mine": mine,
                "channel": channel.name,
                "lent": lent if lends else "",
            }
            row.blocks.append(Block(*place, css, label, title, details, short))
            if previous is not None and previous.target != r.target and r.target is not None and estimates:
                lost = adjacent_switch_minutes(
                    load_seconds=estimates[(channel.node_id, r.target)],
                    gap_seconds=(r.start - previous.end).total_seconds(),
                )
                lost_place = (
                    placed(r.start, r.start + timedelta(minutes=lost), origin, span) if lost else None
                )
                if lost_place:
                    row.blocks.append(Block(*lost_place, "lost", "", f"about {lost} min lost to loading"))
            previous = r
        for segment in plans.get(channel.pk, []):
            if segment.reason not in PRELOADING | MANUAL:
                continue
            place = placed(segment.start, segment.end, origin, span)
            if place is None:
                continue
            model = names.get(segment.target.model_id, "nothing") if segment.target else "nothing"
            kind = "manual" if segment.reason in MANUAL else "preload"
            title = f"{segment.reason.replace('_', ' ')}: {model} from {segment.start.astimezone(tz):%H:%M}"
            row.plan.append(Block(*place, kind, "", title))
        rows.append(row)
    return rows


# The calendar shows days of years that a booking can be in (slotserve_base.api_fields).
FIRST_DAY, LAST_DAY = date(1970, 1, 8), date(8999, 12, 24)


def number_param(raw: str | None) -> int | None:
    return int(raw) if raw and is_id(raw) and len(raw) < 12 else None


def day_param(raw: str | None, today: date) -> date:
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
    view = request.GET.get("view")
    if view == "month":
        from portal.calendar_month import month_page  # the month's own module, which reads this one

        return month_page(request, now)
    week, agenda = view == "week", view == "agenda"
    day = day_param(request.GET.get("day"), timezone.localdate(now))
    if week:  # from the day the reader's weeks begin on (Settings; Monday unless chosen)
        day -= timedelta(days=(day.weekday() - profile_for(viewer_of(request)).week_start) % 7)
    # The agenda: a week from the day chosen, as a list (a phone's calendar reads it better).
    days = 7 if week or agenda else 1
    origin = timezone.make_aware(datetime.combine(day, time()), tz)
    # Hour ticks over one day: the week view shows each day as a lane of its own.
    ticks = [{"left": i / 24 * 100, "label": f"{i:02d}", "minor": i % 3 != 0} for i in range(24)]
    filters = {name: number_param(request.GET.get(name)) for name in ("channel", "node", "model", "group")}
    days_shown = []
    for offset in range(days):
        lane_day = day + timedelta(days=offset)
        lane_origin = timezone.make_aware(datetime.combine(lane_day, time()), tz)
        # Between local midnights: a daylight-saving day is 23 or 25 hours.
        lane_end = timezone.make_aware(datetime.combine(lane_day + timedelta(days=1), time()), tz)
        days_shown.append((lane_day, lane_origin, lane_end - lane_origin))
    listed = channels_listed(filters["channel"], filters["node"]).values_list("pk", flat=True)
    pages = Paginator(listed, CALENDAR_CHANNELS)
    page = pages.get_page(request.GET.get("page"))
    all_rows = calendar_rows(
        lanes=[(lane_origin, lane_span) for _, lane_origin, lane_span in days_shown],
        now=now,
        viewer=viewer_of(request),
        channel_id=filters["channel"],
        node_id=filters["node"],
        model_id=filters["model"],
        group_id=filters["group"],
        channel_slice=slice(page.start_index() - 1 if pages.count else 0, page.end_index()),
        plans=not agenda,
    )
    lanes: dict[int, dict[str, Any]] = {}
    for (lane_day, lane_origin, lane_span), rows in zip(days_shown, all_rows, strict=True):
        for row in rows:
            lane = lanes.setdefault(row.channel.pk, {"channel": row.channel, "days": []})
            lane["days"].append(
                {
                    "date": lane_day,
                    "label": f"{lane_day:%a %d}",
                    "row": row,
                    "origin": lane_origin,
                    "span_seconds": lane_span.total_seconds(),
                    "now_left": (now - lane_origin) / lane_span * 100
                    if lane_origin <= now < lane_origin + lane_span
                    else None,
                    # The share of the lane that has passed: greyed, and not bookable.
                    "past": min(max((now - lane_origin) / lane_span * 100, 0.0), 100.0),
                }
            )
    # The agenda's days: each day's bookings across the channels shown, in time order.
    listed_days: dict[date, list[tuple[float, str, dict[str, Any]]]] = {d: [] for d, _, _ in days_shown}
    for lane in lanes.values():
        for d in lane["days"]:
            listed_days[d["date"]] += [
                (b.left, lane["channel"].name, b.details) for b in d["row"].blocks if b.details
            ]
            listed_days[d["date"]] += [
                (b.left, lane["channel"].name, {"channel": lane["channel"].name, "closed": b.title})
                for b in d["row"].closed
            ]
    book_url = reverse("portal:book")  # once for the page, not per lane
    context = {
        "agenda": [
            (d, [details for _, _, details in sorted(items, key=lambda i: i[:2])])
            for d, items in listed_days.items()
        ]
        if agenda
        else [],
        "view": view if week or agenda else "",
        "lanes": [
            lane_html(lane, week=week, first=i == 0, book_url=book_url)
            for i, lane in enumerate(lanes.values())
        ]
        if not agenda
        else [],
        **filtering(filters, page),
        "origin": origin,
        "day": day,
        "week": week,
        "ticks": ticks,
        "previous": day - timedelta(days=days),
        "next": day + timedelta(days=days),
        "is_agenda": agenda,
        "today": timezone.localdate(now),
    }
    return render(request, "portal/calendar.html", context)


def filtering(filters: dict[str, int | None], page: Any) -> dict[str, Any]:
    """What the filters' form and the page links need: the filters chosen, as a query, and the
    choices (the calendar's views share them)."""
    return {
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
    }
