"""Usage and utilisation read from the database's roll-ups of the request log
(``gateway.usage.rollups``); ``gateway.usage.utilisation`` does the counting.

Shared by the portal's usage page, its CSV and ``GET /api/usage/``: the same numbers in each.
Staff see everything; anyone else sees their own row and their groups'.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime, time, timedelta, tzinfo
from typing import Any

from django.contrib.auth.models import Group, User
from django.db.models import Count

from channels_app.models import Channel, LoadRecord
from gateway.models import RequestLog
from gateway.usage.rollups import roll_up_for_a_report
from gateway.usage.summed import asked_within, minutes_within
from gateway.usage.utilisation import Demand, Minutes, Span, minutes, shares_of, totals_of, union
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


Booked = list[tuple[Span, int]]


def bookings_within(lo: datetime, hi: datetime) -> Booked:
    """Approved and ended bookings in the period (with their channel's node): read once for a
    report's rows and its channels' shares."""
    found = Reservation.objects.filter(
        status__in=[ReservationStatus.APPROVED, ReservationStatus.ENDED], start__lt=hi, end__gt=lo
    ).values_list("pk", "user_id", "channel_id", "start", "end", "channel__node_id")
    return [
        (Span(start, end, channel_id, user_id=user_id, reservation_id=pk), node_id)
        for pk, user_id, channel_id, start, end, node_id in found
    ]


Touched = dict[tuple[int | None, int | None], tuple[int | None, Minutes]]


def request_minutes(lo: datetime, hi: datetime) -> Touched:
    """The minutes of ``[lo, hi)`` the requests touched, per channel and booking (with the
    booker): read from the roll-ups (``gateway.usage.rollups``), the log rolled up first."""
    roll_up_for_a_report()
    return minutes_within(lo, hi)


def _asked(lo: datetime, hi: datetime, by: str) -> list[tuple[int | None, int | None, Demand]]:
    """What the requests of ``[lo, hi)`` asked, per user (``by`` user or group) or per channel
    (channel or node): ``(user, channel, sums)`` with the other None, from the roll-ups (caught
    up by ``request_minutes``, which every report reads first). The
    users or channels of the hour before come too, with nothing asked in the period: their
    minutes may reach into it."""
    per = "user_id" if by in ("user", "group") else "channel_id"
    sums = asked_within(lo, hi, per)
    for before in (
        RequestLog.objects.filter(at__gte=lo - timedelta(hours=1), at__lt=lo)
        .values_list(per, flat=True)
        .distinct()
        .order_by()
    ):
        sums.setdefault(before, Demand())
    return [
        (key if per == "user_id" else None, key if per == "channel_id" else None, summed)
        for key, summed in sums.items()
    ]


def _borrowed(lo: datetime, hi: datetime) -> list[tuple[int, int | None, int]]:
    """The borrowed requests of ``[lo, hi)`` (docs/gateway.md, "Lending"): ``(borrower, channel,
    requests)``. Few, and found by their own index."""
    return list(
        RequestLog.objects.filter(borrowed=True, at__gte=lo, at__lt=hi)
        .values_list("user_id", "channel_id")
        .annotate(n=Count("pk"))
        .order_by()
    )


def lent_minutes(lo: datetime, hi: datetime) -> dict[int | None, Minutes]:
    """The minutes of ``[lo, hi)`` that borrowed requests touched, per channel: read from the
    log's few borrowed rows (their own index), so kept as long as the log
    (``SLOTSERVE_REQUEST_LOG_DAYS``). Those of the hour before come too: they may reach into it."""
    found: dict[int | None, Minutes] = defaultdict(int)
    for channel_id, at, took in RequestLog.objects.filter(
        borrowed=True, at__gte=lo - timedelta(hours=1), at__lt=hi
    ).values_list("channel_id", "at", "duration_ms"):
        found[channel_id] |= minutes(at, at + timedelta(milliseconds=took), lo, hi)
    return found


def usage_rows(
    *,
    by: str,
    lo: datetime,
    hi: datetime,
    now: datetime,
    viewer: User,
    touched: Touched | None = None,
    period_bookings: Booked | None = None,
) -> list[dict[str, Any]]:
    """One row per user, group, channel or node: booked, used and idle booked hours until
    ``now``, booked hours still to come, requests, tokens and mean time to first token in
    ``[lo, hi)``, and the requests among them that were borrowed (a user's, a group's) or lent
    (a channel's, a node's) in someone's idle slot."""
    if by not in BY:
        raise ValueError(f"by={by!r}: use one of {', '.join(BY)}")
    if by in ("channel", "node") and not viewer.is_staff:
        raise NotYours(f"usage by {by} is for staff; you may see it by user (yours) or by group (yours)")
    bookings = bookings_within(lo, hi) if period_bookings is None else period_bookings
    touched = request_minutes(lo, hi) if touched is None else touched
    node_of = dict(Channel.objects.values_list("pk", "node_id"))
    groups_of: dict[int, set[int]] = defaultdict(set)
    for member, group_id in User.groups.through.objects.values_list("user_id", "group_id"):
        groups_of[member].add(group_id)

    def keys(user_id: int | None, channel_id: int | None, node: int | None = None) -> list[int]:
        if by == "user":
            return [user_id] if user_id is not None else []
        if by == "group":
            return sorted(groups_of.get(user_id or 0, set()))
        if by == "channel":
            return [channel_id] if channel_id is not None else []
        found = node if node is not None else node_of.get(channel_id or 0)
        return [found] if found is not None else []

    held: dict[int, list[Span]] = defaultdict(list)
    asked: dict[int, Demand] = defaultdict(Demand)
    for booking, node in bookings:
        for key in keys(booking.user_id, booking.channel_id, node):
            held[key].append(booking)
    # Minutes used count a booking's own requests only.
    ran = {booking: bits for (_, booking), (_, bits) in touched.items() if booking is not None}
    for asker, channel_id, summed in _asked(lo, hi, by):
        for key in keys(asker, channel_id):
            asked[key] += summed
    lent = lent_minutes(lo, hi)
    borrowed: dict[int, int] = defaultdict(int)
    for borrower, channel_id, n in _borrowed(lo, hi):
        for key in keys(borrower, channel_id):
            borrowed[key] += n
    names: dict[int, str] = {}
    if by == "user":
        # Every user's name (a thousand short rows), not a query naming a thousand ids.
        names = dict(User.objects.values_list("pk", "username"))
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
        counted = totals_of(
            bookings=held.get(key, []),
            ran=ran,
            asked=asked.get(key, Demand()),
            lo=lo,
            hi=hi,
            now=now,
            lent=lent,
        )
        rows.append(
            {
                "id": key,
                "name": names.get(key, f"#{key}"),
                **counted.as_dict(),
                "borrowed": borrowed.get(key, 0),
            }
        )
    return rows


def share_rows(
    *,
    lo: datetime,
    hi: datetime,
    now: datetime,
    viewer: User,
    touched: Touched | None = None,
    period_bookings: Booked | None = None,
) -> list[dict[str, Any]]:
    """How each channel's time went in ``[lo, hi)`` until ``now`` (staff): hours switching,
    serving its bookers, lent to others while they were idle, booked but idle, serving everyone
    on the default, idle; and its booked hours still to come."""
    if not viewer.is_staff:
        raise NotYours("how channels' time went is for staff")
    touched = request_minutes(lo, hi) if touched is None else touched
    switching: dict[int | None, Minutes] = defaultdict(int)
    booked: dict[int | None, Minutes] = defaultdict(int)
    booker: dict[int | None, Minutes] = defaultdict(int)
    default: dict[int | None, Minutes] = defaultdict(int)
    for loaded_on, started, finished in LoadRecord.objects.filter(
        started__lt=hi, started__gte=lo - timedelta(hours=1)
    ).values_list("channel_id", "started", "finished"):
        switching[loaded_on] |= minutes(started, finished or now, lo, hi)
    for booking, _ in bookings_within(lo, hi) if period_bookings is None else period_bookings:
        booked[booking.channel_id] |= union([booking], lo, hi)
    for (served_on, reservation_id), (_, bits) in touched.items():
        (booker if reservation_id is not None else default)[served_on] |= bits
    lent = lent_minutes(lo, hi)
    return [
        {
            "id": channel_id,
            "name": name,
            **shares_of(
                switching=switching[channel_id],
                booked=booked[channel_id],
                booker=booker[channel_id],
                default=default[channel_id],
                lent=lent.get(channel_id, 0),
                lo=lo,
                hi=hi,
                now=now,
                since=added,
            ),
        }
        for channel_id, name, added in Channel.objects.values_list("pk", "name", "created")
    ]
