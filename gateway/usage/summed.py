"""Reading usage's roll-ups (``gateway.usage.rollups``): the minutes the requests touched, and
what they asked, over any period, from the coarsest roll-up that covers each part of it."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.db.models import Count, QuerySet, Sum

from gateway.models import RequestDay, RequestHour, RequestLog, RequestMinutes, RequestMinutesDay
from gateway.usage.utilisation import Demand, Minutes

HOUR = timedelta(hours=1)


def minutes_within(
    lo: datetime, hi: datetime
) -> dict[tuple[int | None, int | None], tuple[int | None, Minutes]]:
    """The minutes of ``[lo, hi)`` the requests touched, per channel and booking: the booker (for
    a booking's) and the minutes, as ``gateway.usage.utilisation`` counts them (bit i: the i-th minute
    from ``lo``'s). Whole days (UTC) come from the daily rows, the hours beside them from the
    hourly ones."""
    base = int(lo.timestamp() // 60)
    period = (1 << (int(-(-hi.timestamp() // 60)) - base)) - 1
    found: dict[tuple[int | None, int | None], tuple[int | None, Minutes]] = {}

    def add(channel: int | None, booking: int | None, user: int | None, first_minute: int, bits: int) -> None:
        shift = first_minute - base
        placed = (bits << shift if shift >= 0 else bits >> -shift) & period
        if placed:
            _, before = found.get((channel, booking), (user, 0))
            found[channel, booking] = (user, before | placed)

    hours_lo, hours_hi = int(lo.timestamp() // 3600), int(-(-hi.timestamp() // 3600))
    days_lo, days_hi = -(-hours_lo // 24), max(hours_hi // 24, -(-hours_lo // 24))
    if days_lo < days_hi:
        for channel, booking, user, day, blob in RequestMinutesDay.objects.filter(
            day__gte=_date(days_lo), day__lt=_date(days_hi)
        ).values_list("channel_id", "reservation_id", "user_id", "day", "minutes"):
            add(channel, booking, user, _days(day) * 1440, int.from_bytes(blob, "little"))
        spans = [(hours_lo, days_lo * 24), (days_hi * 24, hours_hi)]
    else:
        spans = [(hours_lo, hours_hi)]
    for a, b in spans:
        if a >= b:
            continue
        for channel, booking, user, hour, bits in RequestMinutes.objects.filter(
            hour__gte=a, hour__lt=b
        ).values_list("channel_id", "reservation_id", "user_id", "hour", "minutes"):
            add(channel, booking, user, hour * 60, bits)
    return found


EPOCH = date(1970, 1, 1)


def _date(days: int) -> date:
    return EPOCH + timedelta(days=days)


def _days(day: date) -> int:
    return (day - EPOCH).days


def _day_after(moment: datetime) -> datetime:
    """The first midnight (UTC) at or after ``moment``."""
    floor = moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return floor if floor == moment else floor + timedelta(days=1)


def _hour_after(moment: datetime) -> datetime:
    """The first whole hour (UTC) at or after ``moment``."""
    floor = moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return floor if floor == moment else floor + HOUR


# What a sum of requests is made of, in the roll-ups and in the log itself.
_HOURS_SUMS = {
    "n": Sum("requests"),
    "prompt": Sum("prompt_tokens"),
    "completion": Sum("completion_tokens"),
    "ttft": Sum("ttft_ms_sum"),
    "ttft_n": Sum("ttft_count"),
}
_LOG_SUMS = {
    "n": Count("pk"),
    "prompt": Sum("prompt_tokens"),
    "completion": Sum("completion_tokens"),
    "ttft": Sum("ttft_ms"),
    "ttft_n": Count("ttft_ms"),
}


def asked_within(lo: datetime, hi: datetime, per: str) -> dict[int | None, Demand]:
    """What the requests of ``[lo, hi)`` asked, per ``user_id`` or ``channel_id``: the whole
    days (UTC) from the daily roll-ups, the whole hours beside them from the hourly ones, the
    parts of an hour at either end (a zone whose midnight is not on the hour) from the log."""
    inner_lo = min(_hour_after(lo), hi)
    inner_hi = max(hi.astimezone(UTC).replace(minute=0, second=0, microsecond=0), inner_lo)
    days_lo = min(_day_after(inner_lo), inner_hi)
    days_hi = max(inner_hi.replace(hour=0), days_lo)
    hourly = RequestHour.objects.values(per).annotate(**_HOURS_SUMS)
    parts: list[QuerySet[Any]] = [
        RequestDay.objects.filter(
            per=per.removesuffix("_id"), day__gte=days_lo.date(), day__lt=days_hi.date()
        )
        .values(per)
        .annotate(**_HOURS_SUMS)
    ]
    parts += [
        hourly.filter(hour__gte=a, hour__lt=b) for a, b in ((inner_lo, days_lo), (days_hi, inner_hi)) if a < b
    ]
    parts += [
        RequestLog.objects.filter(at__gte=a, at__lt=b).values(per).annotate(**_LOG_SUMS)
        for a, b in ((lo, inner_lo), (inner_hi, hi))
        if a < b
    ]
    found: dict[int | None, Demand] = defaultdict(Demand)
    for part in parts:
        for row in part.order_by():
            found[row[per]] += Demand(
                row["n"] or 0,
                row["prompt"] or 0,
                row["completion"] or 0,
                row["ttft"] or 0.0,
                row["ttft_n"] or 0,
            )
    return found
