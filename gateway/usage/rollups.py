"""Roll-ups of the request log, kept as it is written: what usage reads instead of every request.

``RequestHour``  per hour, user and channel: the requests, their tokens and times to first token.
``RequestDay``   the same per day (UTC) and user, and per day and channel: what a week reads.
``RequestMinutes`` per hour, channel and booking: the minutes the requests touched, as bits
                 (``gateway.usage.utilisation`` counts minutes). A booking's carry its booker; those
                 outside bookings carry nobody.

``roll_up`` folds in the log's rows past the mark (``RollupMark``), in the order they were
written, under a lock the request-log flush holds while it inserts, so each row is folded in
exactly once. Reports roll up whatever is left before they read: rows written to the table by
other means (a test, a few by hand) count too. A mass of them (more than
``SLOTSERVE_USAGE_BACKLOG_ROWS``: a restore, an import of old logs) is never folded by a flush
or a report: it is set aside as the *backlog*, which ``catch_up`` (the ``catch_up_usage`` task,
or ``manage.py catch_up_usage``) folds in hour order, a bounded window a transaction, while
reports say how far it has come. The roll-ups outlive the rows (``SLOTSERVE_REQUEST_LOG_DAYS``):
a report of a period whose rows are gone still adds up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, Max, Min, Q, QuerySet
from django.utils import timezone

from gateway.models import (
    RequestDay,
    RequestHour,
    RequestLog,
    RequestMinutes,
    RequestMinutesDay,
    RollupMark,
)
from gateway.usage import row_writes
from slotserve_base import dispatch

log = logging.getLogger(__name__)

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
    """Fold the log's rows past the mark into the roll-ups, a batch a transaction; how many. A
    mass of them is set aside as the backlog instead (``set_aside``), and no call folds more
    than ``SLOTSERVE_USAGE_BACKLOG_ROWS``: a page or a flush never does unbounded work."""
    done = 0
    while True:
        with transaction.atomic():
            mark = lock_mark()
            set_aside(mark)
            folded = fold(mark, batch=batch)
        done += folded
        if folded < batch or done >= settings.SLOTSERVE_USAGE_BACKLOG_ROWS:
            return done


def roll_up_for_a_report() -> None:
    """What a report does before it reads the roll-ups: ``roll_up``, unless a catch-up is under
    way. Its windows hold the mark while they fold (a second or two each of a large backlog), and
    a report would wait for each: it reads what is folded so far and says how far that is
    (``catching_up``); the rows flushed meanwhile are folded by their flush."""
    if catching_up() is None:
        roll_up()


def set_aside(mark: RollupMark) -> bool:
    """With more than ``SLOTSERVE_USAGE_BACKLOG_ROWS`` rows past ``mark`` (locked by the caller)
    and no backlog already, make them the backlog and send the catch-up; whether it did."""
    top = RequestLog.objects.aggregate(top=Max("pk"))["top"] or 0
    if mark.backlog_to or top - mark.last_id <= settings.SLOTSERVE_USAGE_BACKLOG_ROWS:
        return False
    span = RequestLog.objects.filter(pk__gt=mark.last_id, pk__lte=top).aggregate(
        first=Min("at"), last=Max("at"), n=Count("pk")
    )
    if not span["n"]:
        return False
    changes = {
        "backlog_from": mark.last_id,
        "backlog_to": top,
        "backlog_hour": span["first"].astimezone(UTC).replace(minute=0, second=0, microsecond=0),
        "backlog_until": span["last"],
        "backlog_rows": span["n"],
        "backlog_done": 0,
        "last_id": top,
    }
    RollupMark.objects.filter(pk=mark.pk).update(**changes)
    for name, value in changes.items():
        setattr(mark, name, value)
    log.info("usage: %d request-log rows set aside to be caught up in the background", span["n"])
    transaction.on_commit(lambda: dispatch.send_quietly(dispatch.CATCH_UP_USAGE), robust=True)
    return True


def fold(mark: RollupMark, *, batch: int = BATCH) -> int:
    """One batch of rows past ``mark`` (locked by the caller) into the roll-ups; how many."""
    rows = list(_values(RequestLog.objects.filter(pk__gt=mark.last_id).order_by("pk"))[:batch])
    if not rows:
        return 0
    _fold_rows(rows)
    RollupMark.objects.filter(pk=mark.pk).update(last_id=rows[-1][0])
    mark.last_id = rows[-1][0]
    return len(rows)


def catching_up() -> float | None:
    """How far the backlog is caught up (0 to 1), or None when there is none."""
    mark = RollupMark.objects.filter(pk=1).first()
    return None if mark is None else mark.catching_up


@dataclass(frozen=True)
class CaughtUp:
    done: int  # the backlog's rows folded so far
    rows: int  # all of them
    finished: bool  # no backlog is left


def catch_up(*, rows: int = BATCH, seconds: float | None = None, windows: int | None = None) -> CaughtUp:
    """Fold the backlog in hour order: a window of hours holding about ``rows`` rows a
    transaction (at most twice that, unless one hour holds more), until it is done, ``seconds``
    have passed or ``windows`` were folded."""
    deadline = None if seconds is None else time.monotonic() + seconds
    count = 0
    while True:
        with transaction.atomic():
            mark = lock_mark()
            if mark.backlog_to:
                _catch_up_window(mark, rows)
                count += 1
        if not mark.backlog_to:
            return CaughtUp(mark.backlog_done, mark.backlog_rows, True)
        if (deadline is not None and time.monotonic() >= deadline) or (
            windows is not None and count >= windows
        ):
            return CaughtUp(mark.backlog_done, mark.backlog_rows, False)


def _catch_up_window(mark: RollupMark, rows: int) -> None:
    assert mark.backlog_hour is not None and mark.backlog_until is not None
    begin = mark.backlog_hour
    hours_left = max((mark.backlog_until - begin) / HOUR, 1.0)
    # The hours that hold about ``rows`` of the rows left, as they spread over the hours left.
    width = HOUR * max(1, int(hours_left * rows / max(mark.backlog_rows - mark.backlog_done, 1)))
    backlog = RequestLog.objects.filter(pk__gt=mark.backlog_from, pk__lte=mark.backlog_to)
    found = list(
        _values(backlog.filter(at__gte=begin, at__lt=begin + width).order_by("at", "pk"))[: 2 * rows]
    )
    end = begin + width
    if len(found) == 2 * rows:  # denser than the average: up to the last whole hour read
        cut = found[-1][1].astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        if cut > begin:
            end, found = cut, [row for row in found if row[1] < cut]
        else:  # a single hour holds more: all of it, whatever it holds
            end = begin + HOUR
            found = list(_values(backlog.filter(at__gte=begin, at__lt=end)))
    if found:
        _fold_rows(found)
    if end > mark.backlog_until:  # done: no backlog left
        changes: dict[str, Any] = {"backlog_from": 0, "backlog_to": 0, "backlog_hour": None}
        changes |= {"backlog_until": None, "backlog_done": mark.backlog_rows}
        log.info("usage: the backlog's %d request-log rows are caught up", mark.backlog_rows)
    else:
        changes = {"backlog_hour": end, "backlog_done": mark.backlog_done + len(found)}
    RollupMark.objects.filter(pk=mark.pk).update(**changes)
    for name, value in changes.items():
        setattr(mark, name, value)


Row = tuple[int, datetime, float, int, int | None, int | None, int, int, float | None]


def _values(rows: QuerySet[RequestLog]) -> QuerySet[Any]:
    return rows.values_list(
        "pk",
        "at",
        "duration_ms",
        "user_id",
        "channel_id",
        "reservation_id",
        "prompt_tokens",
        "completion_tokens",
        "ttft_ms",
    )


def _fold_rows(rows: list[Row]) -> None:
    """Add ``rows`` to the hourly sums and the touched minutes."""
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
    _fold_days(hours)
    if touched:
        _fold_minutes(touched)


def _fold_hours(hours: dict[tuple[datetime, int, int | None], list[float]]) -> None:
    first, last = min(h for h, _, _ in hours), max(h for h, _, _ in hours)
    stored = {
        (hour, user, channel): (pk, sums)
        for hour, user, channel, pk, *sums in RequestHour.objects.filter(
            hour__gte=first, hour__lte=last
        ).values_list("hour", "user_id", "channel_id", "pk", *SUMS)
    }
    changed, new = [], []
    for key, sums in hours.items():
        found = stored.get(key)
        if found is None:
            new.append((*key, *_added(None, sums)))
        else:
            changed.append((*_added(found[1], sums), found[0]))
    row_writes.update(RequestHour, SUMS, changed)
    row_writes.insert(RequestHour, ["hour", "user_id", "channel_id", *SUMS], new)


SUMS = ["requests", "prompt_tokens", "completion_tokens", "ttft_ms_sum", "ttft_count"]


def _added(stored: Sequence[float] | None, sums: list[float]) -> tuple[int, int, int, float, int]:
    """A roll-up row's sums (none yet: zeros) plus a batch's: requests, prompt and completion
    tokens, time to first token summed and counted."""
    n, prompt, completion, ttft_sum, ttft_n = stored or (0, 0, 0, 0.0, 0)
    return (
        int(n) + int(sums[0]),
        int(prompt) + int(sums[1]),
        int(completion) + int(sums[2]),
        float(ttft_sum) + sums[3],
        int(ttft_n) + int(sums[4]),
    )


def _fold_days(hours: dict[tuple[datetime, int, int | None], list[float]]) -> None:
    """The hours' sums added to their day's, per user and per channel."""
    days: dict[tuple[date, str, int | None], list[float]] = {}
    for (hour, user, channel), sums in hours.items():
        for per, key in (("user", user), ("channel", channel)):
            into = days.setdefault((hour.date(), per, key), [0, 0, 0, 0.0, 0])
            for i, value in enumerate(sums):
                into[i] += value
    users = {key for (_, per, key) in days if per == "user"}
    channels = {key for (_, per, key) in days if per == "channel" and key is not None}
    first, last = min(d for d, _, _ in days), max(d for d, _, _ in days)
    stored: dict[tuple[date, str, int | None], tuple[int, Sequence[float]]] = {}
    for day, per, user, channel, pk, *sums in (
        RequestDay.objects.filter(day__gte=first, day__lte=last)
        .filter(
            Q(per="user", user_id__in=users)
            | Q(per="channel", channel_id__in=channels)
            | Q(per="channel", channel__isnull=True)
        )
        .values_list("day", "per", "user_id", "channel_id", "pk", *SUMS)
    ):
        stored[day, per, user if per == "user" else channel] = (pk, sums)
    changed, new = [], []
    for (day, per, key), sums in days.items():
        found = stored.get((day, per, key))
        if found is None:
            of_user, of_channel = (key if per == "user" else None), (key if per == "channel" else None)
            new.append((day, per, of_user, of_channel, *_added(None, sums)))
        else:
            changed.append((*_added(found[1], sums), found[0]))
    row_writes.update(RequestDay, SUMS, changed)
    row_writes.insert(RequestDay, ["day", "per", "user_id", "channel_id", *SUMS], new)


def _fold_minutes(touched: dict[tuple[int, int | None, int | None], list[int]]) -> None:
    """The new minutes or-ed into the stored ones of their hour, channel and booking."""
    first, last = min(h for h, _, _ in touched), max(h for h, _, _ in touched)
    stored: dict[tuple[int, int | None, int | None], tuple[int, int]] = {
        (hour, channel, booking): (pk, minutes)
        for hour, channel, booking, pk, minutes in RequestMinutes.objects.filter(
            hour__gte=first, hour__lte=last
        ).values_list("hour", "channel_id", "reservation_id", "pk", "minutes")
    }
    changed, new = [], []
    for (hour, channel, booking), (bits, booker) in touched.items():
        found = stored.get((hour, channel, booking))
        if found is None:
            new.append((hour, channel, booking, booker or None, bits))
        elif found[1] | bits != found[1]:
            changed.append((found[1] | bits, found[0]))
    row_writes.update(RequestMinutes, ["minutes"], changed)
    row_writes.insert(RequestMinutes, ["hour", "channel_id", "reservation_id", "user_id", "minutes"], new)
    _fold_minute_days(touched)


DAY_BYTES = 180  # 1,440 minutes


def _fold_minute_days(touched: dict[tuple[int, int | None, int | None], list[int]]) -> None:
    """The new minutes or-ed into their day's, per channel and booking (``RequestMinutesDay``)."""
    days: dict[tuple[date, int | None, int | None], list[int]] = {}
    for (hour, channel, booking), (bits, booker) in touched.items():
        day = datetime.fromtimestamp(hour // 24 * 86400, tz=UTC).date()
        into = days.setdefault((day, channel, booking), [0, booker])
        into[0] |= bits << (hour % 24 * 60)
    stored: dict[tuple[date, int | None, int | None], tuple[int, bytes | memoryview]] = {
        (day, channel, booking): (pk, minutes)
        for day, channel, booking, pk, minutes in RequestMinutesDay.objects.filter(
            day__gte=min(d for d, _, _ in days), day__lte=max(d for d, _, _ in days)
        ).values_list("day", "channel_id", "reservation_id", "pk", "minutes")
    }
    changed, new = [], []
    for (day, channel, booking), (bits, booker) in days.items():
        found = stored.get((day, channel, booking))
        if found is None:
            new.append((day, channel, booking, booker or None, bits.to_bytes(DAY_BYTES, "little")))
            continue
        before = int.from_bytes(found[1], "little")
        if before | bits != before:
            changed.append(((before | bits).to_bytes(DAY_BYTES, "little"), found[0]))
    row_writes.update(RequestMinutesDay, ["minutes"], changed)
    row_writes.insert(RequestMinutesDay, ["day", "channel_id", "reservation_id", "user_id", "minutes"], new)
