"""The calendar's month: the whole weeks that hold a month, from the reader's week start, each
day with its first bookings and blackouts (docs/portal.md, "Calendar")."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from portal.calendar import CALENDAR_CHANNELS, channels_listed, day_param, filtering, number_param
from portal.views import viewer_of
from reservations.models import Blackout, Reservation, ReservationStatus
from reservations.profiles import profile_for
from reservations.wording import slot_words

# A month's day shows this many bookings; the rest are counted, the day view has them all.
MONTH_SHOWN = 4


@dataclass
class MonthDay:
    day: date
    in_month: bool
    raw: list[tuple[Any, ...]] = field(default_factory=list)  # (start, order, what it is), any order
    shown: list[dict[str, Any]] = field(default_factory=list)  # the first ``MONTH_SHOWN``, in words
    count: int = 0

    @property
    def more(self) -> int:
        return self.count - len(self.shown)


def month_grid(
    *, month: date, week_start: int, viewer: User, channel_ids: list[int], filters: dict[str, int | None]
) -> list[list[MonthDay]]:
    """The weeks that hold ``month``'s days (from the reader's week start), each day with the
    blackouts and bookings of ``channel_ids`` it holds (a booking over midnight on each of its
    days) in time order: the first ``MONTH_SHOWN`` in words, the rest counted. Two queries,
    whatever the month holds; only what is shown is put in words (a month of 50 busy channels
    holds thousands of bookings)."""
    tz = timezone.get_current_timezone()
    first = month.replace(day=1)
    after = (first + timedelta(days=32)).replace(day=1)
    begin = first - timedelta(days=(first.weekday() - week_start) % 7)
    end = after + timedelta(days=(week_start - after.weekday()) % 7)
    days = {
        begin + timedelta(days=i): MonthDay(
            begin + timedelta(days=i), (begin + timedelta(days=i)).month == first.month
        )
        for i in range((end - begin).days)
    }
    lo = timezone.make_aware(datetime.combine(begin, time()), tz)
    hi = timezone.make_aware(datetime.combine(end, time()), tz)

    def place(start: datetime, stop: datetime, order: int, what: tuple[Any, ...]) -> None:
        day = max(start.astimezone(tz).date(), begin)
        last = (stop - timedelta(microseconds=1)).astimezone(tz).date()
        while day <= last and day in days:
            days[day].raw.append((start, order, what))
            day += timedelta(days=1)

    booked = (
        Reservation.objects.exclude(status__in=[ReservationStatus.REJECTED, ReservationStatus.CANCELLED])
        .overlapping(lo, hi)
        .filter(channel_id__in=channel_ids)
    )
    if filters["model"] is not None:
        booked = booked.filter(model_id=filters["model"])
    if filters["group"] is not None:
        booked = booked.filter(user__groups__id=filters["group"])
    fields = (
        "start",
        "end",
        "user_id",
        "user__username",
        "channel__name",
        "model__name",
        "exclusive",
        "status",
    )
    for row in booked.values_list(*fields):
        place(row[0], row[1], 1, row)
    for blackout in Blackout.objects.filter(start__lt=hi, end__gt=lo).prefetch_related("channels"):
        named = [c.name for c in blackout.channels.all() if c.pk in channel_ids or not channel_ids]
        if blackout.channels.all() and not named:
            continue
        place(blackout.start, blackout.end, 0, (blackout, ", ".join(named) or "every channel"))
    for d in days.values():
        d.count = len(d.raw)
        d.shown = [
            _in_words(what, viewer, tz) for _, _, what in sorted(d.raw, key=lambda r: r[:2])[:MONTH_SHOWN]
        ]
        d.raw = []
    ordered = list(days.values())
    return [ordered[i : i + 7] for i in range(0, len(ordered), 7)]


def _in_words(what: tuple[Any, ...], viewer: User, tz: Any) -> dict[str, Any]:
    """A booking's row (``month_grid``'s fields) or a blackout, as the month's day says it."""
    if isinstance(what[0], Blackout):
        blackout, named = what
        return {
            "time": f"{blackout.start.astimezone(tz):%H:%M}",
            "closed": named,
            "title": f"closed {slot_words(blackout.start, blackout.end, tz)}: {blackout.reason}",
        }
    start, end, user_id, username, channel, model, exclusive, status = what
    mine = user_id == viewer.pk
    runs = "the whole card" if exclusive else (model or "")
    return {
        "time": f"{start.astimezone(tz):%H:%M}",
        "channel": channel,
        "who": "yours" if mine else username,
        "mine": mine,
        "pending": status == ReservationStatus.PENDING,
        "title": f"{username}, {slot_words(start, end, tz)}, {channel}: {runs}",
    }


def month_page(request: HttpRequest, now: datetime) -> HttpResponse:
    """The month view: each day of the month with what it holds, as a booking tool's month."""
    today = timezone.localdate(now)
    month = day_param(request.GET.get("day"), today).replace(day=1)
    filters = {name: number_param(request.GET.get(name)) for name in ("channel", "node", "model", "group")}
    pages = Paginator(
        channels_listed(filters["channel"], filters["node"]).values_list("pk", flat=True), CALENDAR_CHANNELS
    )
    page = pages.get_page(request.GET.get("page"))
    week_start = profile_for(viewer_of(request)).week_start
    weeks = month_grid(
        month=month,
        week_start=week_start,
        viewer=viewer_of(request),
        channel_ids=list(page.object_list),
        filters=filters,
    )
    context = {
        "weeks": weeks,
        "weekdays": [f"{(weeks[0][i].day):%a}" for i in range(7)],
        "view": "month",
        "is_month": True,
        "day": month,
        "today": today,
        "previous": (month - timedelta(days=1)).replace(day=1),
        "next": (month + timedelta(days=32)).replace(day=1),
        **filtering(filters, page),
        "origin": timezone.make_aware(datetime.combine(month, time()), timezone.get_current_timezone()),
    }
    return render(request, "portal/calendar_month.html", context)
