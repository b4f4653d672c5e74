"""Roll-ups of the request log, kept as it is written: what usage reads instead of every request.

``RequestHour``  per hour, user and channel: the requests, their tokens and times to first token.
``RequestRun``   per channel and booking: the runs of minutes the requests touched, merged where
                 they touch (``gateway.utilisation`` counts minutes). A booking's runs carry its
                 booker; the runs outside bookings carry nobody.

``roll_up`` folds in the log's rows past the mark (``RollupMark``), in the order they were
written, under a lock the request-log flush holds while it inserts, so each row is folded in
exactly once. Reports roll up whatever is left before they read: rows written to the table by
other means (a restore, a test) count too. The roll-ups outlive the rows
(``SLOTSERVE_REQUEST_LOG_DAYS``): a report of a period whose rows are gone still adds up.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from gateway.models import RequestHour, RequestLog, RequestRun, RollupMark
from gateway.utilisation import Asked, Span

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
    spans: dict[tuple[int | None, int | None], list[tuple[int, int, int | None]]] = defaultdict(list)
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
            end = start + duration / 1000
            spans[channel, booking].append((int(start // 60), int(-(-end // 60)), user if booking else None))
    _fold_hours(hours)
    if spans:
        _fold_runs(spans)
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


def _fold_runs(spans: dict[tuple[int | None, int | None], list[tuple[int, int, int | None]]]) -> None:
    """The new spans merged with the stored runs they touch, per channel and booking."""
    lo = min(first for found in spans.values() for first, _, _ in found)
    hi = max(past for found in spans.values() for _, past, _ in found)
    channels = {channel for channel, _ in spans}
    on = Q(channel_id__in=[c for c in channels if c is not None])
    if None in channels:
        on |= Q(channel_id__isnull=True)
    stale: list[int] = []
    for pk, on_channel, of_booking, booker, from_minute, to_minute in RequestRun.objects.filter(
        on, first_minute__lte=hi, past_minute__gte=lo
    ).values_list("pk", "channel_id", "reservation_id", "user_id", "first_minute", "past_minute"):
        if (on_channel, of_booking) in spans:
            spans[on_channel, of_booking].append((from_minute, to_minute, booker))
            stale.append(pk)
    merged: list[RequestRun] = []
    for (channel, booking), found in spans.items():
        found.sort(key=lambda span: span[:2])
        first, past, user = found[0]
        for next_first, next_past, _ in found[1:]:
            if next_first <= past:  # its minutes touch the run's: the same run
                past = max(past, next_past)
                continue
            merged.append(_run(channel, booking, user, first, past))
            first, past = next_first, next_past
        merged.append(_run(channel, booking, user, first, past))
    RequestRun.objects.filter(pk__in=stale).delete()
    RequestRun.objects.bulk_create(merged, batch_size=2000)


def _run(channel: int | None, booking: int | None, user: int | None, first: int, past: int) -> RequestRun:
    return RequestRun(
        channel_id=channel, reservation_id=booking, user_id=user, first_minute=first, past_minute=past
    )


def runs_within(lo: datetime, hi: datetime) -> list[Span]:
    """The stored runs that touch ``[lo, hi)``, as spans (whole minutes)."""
    first, past = int(lo.timestamp() // 60), int(-(-hi.timestamp() // 60))
    found = RequestRun.objects.filter(first_minute__lt=past, past_minute__gt=first).values_list(
        "channel_id", "reservation_id", "user_id", "first_minute", "past_minute"
    )
    return [
        Span(datetime.fromtimestamp(a * 60, UTC), datetime.fromtimestamp(b * 60, UTC), channel, user, booking)
        for channel, booking, user, a, b in found
    ]


def _hour_after(moment: datetime) -> datetime:
    """The first whole hour (UTC) at or after ``moment``."""
    floor = moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return floor if floor == moment else floor + HOUR


def asked_within(lo: datetime, hi: datetime, per: str) -> dict[int | None, Asked]:
    """What the requests of ``[lo, hi)`` asked, per ``user_id`` or ``channel_id``: the whole
    hours from the roll-ups, the parts of an hour at either end (a zone whose midnight is not on
    the hour) from the log itself."""
    inner_lo = min(_hour_after(lo), hi)
    inner_hi = max(hi.astimezone(UTC).replace(minute=0, second=0, microsecond=0), inner_lo)
    found: dict[int | None, Asked] = defaultdict(Asked)
    summed = (
        RequestHour.objects.filter(hour__gte=inner_lo, hour__lt=inner_hi)
        .values(per)
        .annotate(
            n=Sum("requests"),
            prompt=Sum("prompt_tokens"),
            completion=Sum("completion_tokens"),
            ttft=Sum("ttft_ms_sum"),
            ttft_n=Sum("ttft_count"),
        )
        .order_by()
    )
    for row in summed:
        found[row[per]] += Asked(
            row["n"] or 0, row["prompt"] or 0, row["completion"] or 0, row["ttft"] or 0.0, row["ttft_n"] or 0
        )
    for a, b in ((lo, inner_lo), (inner_hi, hi)):
        if a >= b:
            continue
        edge = (
            RequestLog.objects.filter(at__gte=a, at__lt=b)
            .values(per)
            .annotate(
                n=Count("pk"),
                prompt=Sum("prompt_tokens"),
                completion=Sum("completion_tokens"),
                ttft=Sum("ttft_ms"),
                ttft_n=Count("ttft_ms"),
            )
            .order_by()
        )
        for row in edge:
            found[row[per]] += Asked(
                row["n"], row["prompt"] or 0, row["completion"] or 0, row["ttft"] or 0.0, row["ttft_n"]
            )
    return found
