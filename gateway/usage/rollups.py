"""Roll-ups of the request log, kept as it is written: what usage reads instead of every request.

``RequestHour``  per hour, user and channel: the requests, their tokens and times to first token.
``RequestMinutes`` per hour, channel and booking: the minutes the requests touched, as bits
                 (``gateway.usage.utilisation`` counts minutes). A booking's carry its booker; those
                 outside bookings carry nobody.

``roll_up`` folds in the log's rows past the mark (``RollupMark``), in the order they were
written, under a lock the request-log flush holds while it inserts, so each row is folded in
exactly once. Reports roll up whatever is left before they read: rows written to the table by
other means (a restore, a test) count too. The roll-ups outlive the rows
(``SLOTSERVE_REQUEST_LOG_DAYS``): a report of a period whose rows are gone still adds up.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, QuerySet, Sum
from django.utils import timezone

from gateway.models import RequestHour, RequestLog, RequestMinutes, RollupMark
from gateway.usage.utilisation import Asked, Minutes

BATCH = 20_000
HOUR = timedelta(hours=1)


def lock_mark() -> RollupMark:
    """The mark, locked until this transaction ends. A write first, so that SQLite takes its
    write lock too (``select_for_update`` does nothing there)."""
    if not RollupMark.objects.filter(pk=1).update(locked_at=timezone.now()):
        try:
            with transaction.atomic():
                RollupMark.objects.create(pk=1)
        except IntegrityError:  # another process made it meanwhile
            pass
        RollupMark.objects.filter(pk=1).update(locked_at=timezone.now())
    return RollupMark.objects.get(pk=1)


def roll_up(*, batch: int = BATCH) -> int:
    """Fold the log's rows past the mark into the roll-ups, a batch a transaction; how many."""
    done = 0
    while True:
        with transaction.atomic():
            folded = fold(lock_mark(), batch=batch)
        done += folded
        if folded < batch:
            return done


def fold(mark: RollupMark, *, batch: int = BATCH) -> int:
    """One batch of rows past ``mark`` (locked by the caller) into the roll-ups; how many."""
    rows = list(
        RequestLog.objects.filter(pk__gt=mark.last_id)
        .order_by("pk")
        .values_list(
            "pk",
            "at",
            "duration_ms",
            "user_id",
            "channel_id",
            "reservation_id",
            "prompt_tokens",
            "completion_tokens",
            "ttft_ms",
        )[:batch]
    )
    if not rows:
        return 0
    hours: dict[tuple[datetime, int, int | None], list[float]] = {}
    touched: dict[
        tuple[int, int | None, int | None], list[int]
    ] = {}  # (hour, channel, booking) → [bits, booker]
    for _, at, duration, user, channel, booking, prompt, completion, ttft in rows:
        sums = hours.setdefault(
            (at.replace(minute=0, second=0, microsecond=0), user, channel), [0, 0, 0, 0.0, 0]
        )
        sums[0] += 1
        sums[1] += prompt
        sums[2] += completion
        if ttft is not None:
            sums[3] += ttft
            sums[4] += 1
        if duration > 0:  # a request that took no time touches no minute
            start = at.timestamp()
            first, past = int(start // 60), int(-(-(start + duration / 1000) // 60))
            for hour in range(first // 60, (past - 1) // 60 + 1):
                a, b = max(first, hour * 60) - hour * 60, min(past, hour * 60 + 60) - hour * 60
                found = touched.setdefault((hour, channel, booking), [0, user if booking else 0])
                found[0] |= ((1 << (b - a)) - 1) << a
    _fold_hours(hours)
    if touched:
        _fold_minutes(touched)
    RollupMark.objects.filter(pk=mark.pk).update(last_id=rows[-1][0])
    mark.last_id = rows[-1][0]
    return len(rows)


def _fold_hours(hours: dict[tuple[datetime, int, int | None], list[float]]) -> None:
    first, last = min(h for h, _, _ in hours), max(h for h, _, _ in hours)
    stored = {
        (row.hour, row.user_id, row.channel_id): row
        for row in RequestHour.objects.filter(hour__gte=first, hour__lte=last)
    }
    changed, new = [], []
    for (hour, user, channel), (n, prompt, completion, ttft_sum, ttft_n) in hours.items():
        row = stored.get((hour, user, channel))
        if row is None:
            new.append(
                RequestHour(
                    hour=hour,
                    user_id=user,
                    channel_id=channel,
                    requests=int(n),
                    prompt_tokens=int(prompt),
                    completion_tokens=int(completion),
                    ttft_ms_sum=ttft_sum,
                    ttft_count=int(ttft_n),
                )
            )
            continue
        row.requests += int(n)
        row.prompt_tokens += int(prompt)
        row.completion_tokens += int(completion)
        row.ttft_ms_sum += ttft_sum
        row.ttft_count += int(ttft_n)
        changed.append(row)
    RequestHour.objects.bulk_update(
        changed,
        ["requests", "prompt_tokens", "completion_tokens", "ttft_ms_sum", "ttft_count"],
        batch_size=2000,
    )
    RequestHour.objects.bulk_create(new, batch_size=2000)


def _fold_minutes(touched: dict[tuple[int, int | None, int | None], list[int]]) -> None:
    """The new minutes or-ed into the stored ones of their hour, channel and booking."""
    first, last = min(h for h, _, _ in touched), max(h for h, _, _ in touched)
    stored = {
        (row.hour, row.channel_id, row.reservation_id): row
        for row in RequestMinutes.objects.filter(hour__gte=first, hour__lte=last)
    }
    changed, new = [], []
    for (hour, channel, booking), (bits, booker) in touched.items():
        row = stored.get((hour, channel, booking))
        if row is None:
            new.append(
                RequestMinutes(
                    hour=hour,
                    channel_id=channel,
                    reservation_id=booking,
                    user_id=booker or None,
                    minutes=bits,
                )
            )
        elif row.minutes | bits != row.minutes:
            row.minutes |= bits
            changed.append(row)
    RequestMinutes.objects.bulk_update(changed, ["minutes"], batch_size=2000)
    RequestMinutes.objects.bulk_create(new, batch_size=2000)


def minutes_within(
    lo: datetime, hi: datetime
) -> dict[tuple[int | None, int | None], tuple[int | None, Minutes]]:
    """The minutes of ``[lo, hi)`` the requests touched, per channel and booking: the booker (for
    a booking's) and the minutes, as ``gateway.usage.utilisation`` counts them (bit i: the i-th minute
    from ``lo``'s)."""
    base = int(lo.timestamp() // 60)
    period = (1 << (int(-(-hi.timestamp() // 60)) - base)) - 1
    found: dict[tuple[int | None, int | None], tuple[int | None, Minutes]] = {}
    rows = RequestMinutes.objects.filter(
        hour__gte=int(lo.timestamp() // 3600), hour__lt=int(-(-hi.timestamp() // 3600))
    ).values_list("channel_id", "reservation_id", "user_id", "hour", "minutes")
    for channel, booking, user, hour, bits in rows:
        shift = hour * 60 - base
        placed = (bits << shift if shift >= 0 else bits >> -shift) & period
        if placed:
            _, before = found.get((channel, booking), (user, 0))
            found[channel, booking] = (user, before | placed)
    return found


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


def asked_within(lo: datetime, hi: datetime, per: str) -> dict[int | None, Asked]:
    """What the requests of ``[lo, hi)`` asked, per ``user_id`` or ``channel_id``: the whole
    hours from the roll-ups, the parts of an hour at either end (a zone whose midnight is not on
    the hour) from the log itself."""
    inner_lo = min(_hour_after(lo), hi)
    inner_hi = max(hi.astimezone(UTC).replace(minute=0, second=0, microsecond=0), inner_lo)
    parts: list[QuerySet[Any]] = [
        RequestHour.objects.filter(hour__gte=inner_lo, hour__lt=inner_hi).values(per).annotate(**_HOURS_SUMS)
    ]
    parts += [
        RequestLog.objects.filter(at__gte=a, at__lt=b).values(per).annotate(**_LOG_SUMS)
        for a, b in ((lo, inner_lo), (inner_hi, hi))
        if a < b
    ]
    found: dict[int | None, Asked] = defaultdict(Asked)
    for part in parts:
        for row in part.order_by():
            found[row[per]] += Asked(
                row["n"] or 0,
                row["prompt"] or 0,
                row["completion"] or 0,
                row["ttft"] or 0.0,
                row["ttft_n"] or 0,
            )
    return found
