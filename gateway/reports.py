"""Usage and utilisation read from the database (``gateway.utilisation`` does the counting).

Shared by the portal's usage page, its CSV and ``GET /api/usage/``: the same numbers in each.
Staff see everything; anyone else sees their own row and their groups'.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime, time, timedelta, tzinfo
from typing import Any

from django.contrib.auth.models import Group, User
from django.utils import timezone

from channels_app.models import Channel, LoadRecord
from gateway.models import RequestLog
from gateway.utilisation import Span, channel_shares, totals
from reservations.models import Reservation, ReservationStatus

BY = ("user", "group", "channel", "node")
PERIODS = ("day", "week")


class NotYours(Exception):
    """The view asked for is staff's only."""


def period_bounds(day: date, period: str, zone: tzinfo) -> tuple[datetime, datetime]:
    """Local midnight to local midnight: the day, or the week (Monday on) holding it."""
    first = day - timedelta(days=day.weekday()) if period == "week" else day
    days = 7 if period == "week" else 1
    lo = datetime.combine(first, time(), tzinfo=zone)
    hi = datetime.combine(first + timedelta(days=days), time(), tzinfo=zone)
    return lo, hi


def _bookings(lo: datetime, hi: datetime) -> list[tuple[Span, int]]:
    """Approved and ended bookings in the period (with their channel's node)."""
    found = Reservation.objects.filter(
        status__in=[ReservationStatus.APPROVED, ReservationStatus.ENDED], start__lt=hi, end__gt=lo
    ).values_list("pk", "user_id", "channel_id", "start", "end", "channel__node_id")
    return [
        (Span(start, end, channel_id, user_id=user_id, reservation_id=pk), node_id)
        for pk, user_id, channel_id, start, end, node_id in found
    ]


def _requests(lo: datetime, hi: datetime) -> list[Span]:
    found = RequestLog.objects.filter(at__gte=lo - timedelta(hours=1), at__lt=hi).values_list(
        "at",
        "duration_ms",
        "channel_id",
        "user_id",
        "reservation_id",
        "prompt_tokens",
        "completion_tokens",
        "ttft_ms",
    )
    return [
        Span(at, at + timedelta(milliseconds=duration), channel, user, booking, prompt, completion, ttft)
        for at, duration, channel, user, booking, prompt, completion, ttft in found
    ]


def usage_rows(*, by: str, lo: datetime, hi: datetime, viewer: User) -> list[dict[str, Any]]:
    """One row per user, group, channel or node: booked, used and idle booked hours, requests,
    tokens and mean time to first token in ``[lo, hi)``."""
    if by not in BY:
        raise ValueError(f"by={by!r}: use one of {', '.join(BY)}")
    if by in ("channel", "node") and not viewer.is_staff:
        raise NotYours(f"usage by {by} is for staff; you may see it by user (yours) or by group (yours)")
    bookings, requests = _bookings(lo, hi), _requests(lo, hi)
    node_of = dict(Channel.objects.values_list("pk", "node_id"))
    groups_of: dict[int, set[int]] = defaultdict(set)
    for user_id, group_id in User.groups.through.objects.values_list("user_id", "group_id"):
        groups_of[user_id].add(group_id)

    def keys(span: Span, node: int | None = None) -> list[int]:
        if by == "user":
            return [span.user_id] if span.user_id is not None else []
        if by == "group":
            return sorted(groups_of.get(span.user_id or 0, set()))
        if by == "channel":
            return [span.channel_id] if span.channel_id is not None else []
        found = node if node is not None else node_of.get(span.channel_id or 0)
        return [found] if found is not None else []

    held: dict[int, list[Span]] = defaultdict(list)
    asked: dict[int, list[Span]] = defaultdict(list)
    for booking, node in bookings:
        for key in keys(booking, node):
            held[key].append(booking)
    for request in requests:
        for key in keys(request):
            asked[key].append(request)
    names: dict[int, str] = {}
    if by == "user":
        names = dict(User.objects.filter(pk__in=set(held) | set(asked)).values_list("pk", "username"))
    elif by == "group":
        names = dict(Group.objects.values_list("pk", "name"))
    elif by == "channel":
        names = dict(Channel.objects.values_list("pk", "name"))
    else:
        from channels_app.models import Node

        names = dict(Node.objects.values_list("pk", "name"))
    visible = set(held) | set(asked)
    if not viewer.is_staff:
        visible &= {viewer.pk} if by == "user" else groups_of.get(viewer.pk, set())
    rows = []
    for key in sorted(visible, key=lambda k: names.get(k, "")):
        counted = totals(bookings=held.get(key, []), requests=asked.get(key, []), lo=lo, hi=hi)
        rows.append({"id": key, "name": names.get(key, f"#{key}"), **counted.as_dict()})
    return rows


def share_rows(*, lo: datetime, hi: datetime, viewer: User) -> list[dict[str, Any]]:
    """How each channel's time went in ``[lo, hi)`` (staff): hours switching, serving its
    bookers, booked but idle, serving everyone on the default, idle."""
    if not viewer.is_staff:
        raise NotYours("how channels' time went is for staff")
    bookings, requests = _bookings(lo, hi), _requests(lo, hi)
    loads = [
        Span(started, finished or timezone.now(), channel_id)
        for channel_id, started, finished in LoadRecord.objects.filter(
            started__lt=hi, started__gte=lo - timedelta(hours=1)
        ).values_list("channel_id", "started", "finished")
    ]
    rows = []
    for channel_id, name in Channel.objects.values_list("pk", "name"):
        shares = channel_shares(
            bookings=[b for b, _ in bookings if b.channel_id == channel_id],
            requests=[r for r in requests if r.channel_id == channel_id],
            loads=[load for load in loads if load.channel_id == channel_id],
            lo=lo,
            hi=hi,
        )
        rows.append({"id": channel_id, "name": name, **shares})
    return rows
