"""The request log, from Redis into the database: the gateway pushes one record per request
(``gateway.wire.counters.LEAVE``, off the hot path's database), and the periodic flush writes them
in batches, keeps the roll-ups usage reads (``gateway.usage.rollups``) and drops rows older than
``SLOTSERVE_REQUEST_LOG_DAYS``. Each record carries its request's id, unique among every gateway
process's: one that reaches Redis twice (a count out sent again, ``gateway.wire.counters``) or a
batch written but not taken off Redis is one row, the database's unique constraint says so."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DatabaseError, transaction
from django.utils import timezone

from slotserve_base import locks
from slotserve_base.json_text import is_unicode
from slotserve_base.vocabulary import RedisKey
from slotserve_base.vocabulary import redis_key as key

log = logging.getLogger(__name__)

BATCH = 1000
MAX_BATCHES = 50  # per flush; the rest waits for the next one
# Records kept for a person to look at when the database refused them (``dead_letters``); the
# oldest go past this many.
DEAD_LETTERS_KEPT = 10_000
# A flush's lock lapses this long after its flusher died (it is renewed while the flush lasts).
FLUSH_LOCK_SECONDS = 10


def dead_letters() -> str:
    """The Redis list of records the database would not take, named in ``/metrics``
    (``slotserve_request_log_dead_records``) and kept for a person to look at."""
    return key(RedisKey.REQUEST_LOG, "dead")


def flush_request_log(client: redis.Redis, *, now: datetime | None = None) -> int:
    """Write the waiting records as rows; returns how many. A batch leaves Redis only once its
    rows are saved, so a database that fails keeps them for the next flush. A record that
    cannot be written whatever the database's state (one that does not parse, or holds text
    the database refuses) goes to the dead letters instead of holding up everyone's after it."""
    # One flush at a time: two that read the same batch would both write it, and both take it
    # off the list, the second taking records nobody wrote (flushes that waited out a database
    # outage run together). The other one leaves the records to this. The lock is renewed
    # while the flush lasts and lapses soon after a flusher that died.
    with locks.held(client, key(RedisKey.REQUEST_LOG, "flushing"), FLUSH_LOCK_SECONDS) as mine:
        return _flush(client, now) if mine else 0


def _flush(client: redis.Redis, now: datetime | None) -> int:
    from gateway.models import RequestLog
    from gateway.usage.rollups import BATCH as ROLLUP_BATCH
    from gateway.usage.rollups import fold, lock_mark, roll_up, set_aside

    name = key(RedisKey.REQUEST_LOG, "all")
    written = 0
    for _ in range(MAX_BATCHES):
        raw: Any = client.lrange(name, 0, BATCH - 1)
        if not raw:
            break
        rows, dead = _rows([bytes(r) for r in raw])
        try:
            with transaction.atomic():
                # The roll-ups' mark is locked before the rows get their ids, so that a report
                # rolling up meanwhile cannot pass rows not yet committed (gateway.usage.rollups).
                mark = lock_mark()
                # A record already written (sent twice, or a batch whose trim failed) is skipped.
                RequestLog.objects.bulk_create([row for row, _ in rows], ignore_conflicts=True)
                set_aside(mark)  # a restore's mass is the catch-up's, not this flush's
                for _ in range(max(1, settings.SLOTSERVE_USAGE_BACKLOG_ROWS // ROLLUP_BATCH)):
                    if fold(mark) < ROLLUP_BATCH:
                        break
        except (DatabaseError, ValueError) as exc:
            if not _refused_for_its_content(exc):
                raise  # the database is down or busy: the batch stays for the next flush
            # One of them: each alone tells which.
            kept = []
            for row, item in rows:
                try:
                    with transaction.atomic():
                        RequestLog.objects.bulk_create([row], ignore_conflicts=True)
                except (DatabaseError, ValueError) as exc:
                    if not _refused_for_its_content(exc):
                        raise
                    log.warning("request log: the database refused a record (%s): %r", exc, item[:200])
                    dead.append(item)
                else:
                    kept.append(row)
            rows = [(row, b"") for row in kept]
            roll_up()
        if dead:
            keeping = client.pipeline()
            keeping.rpush(dead_letters(), *dead)
            keeping.ltrim(dead_letters(), -DEAD_LETTERS_KEPT, -1)
            keeping.execute()
        client.ltrim(name, len(raw), -1)
        written += len(rows)
    moment = now or timezone.now()
    RequestLog.objects.filter(at__lt=moment - timedelta(days=settings.SLOTSERVE_REQUEST_LOG_DAYS)).delete()
    return written


def _refused_for_its_content(exc: Exception) -> bool:
    """Whether the database refused a row for what it holds (text it cannot store), rather than
    for being down: only such a row is set aside."""
    if isinstance(exc, ValueError):  # a string no encoder writes, or NUL for PostgreSQL
        return True
    from django.db import DataError

    return isinstance(exc, DataError)


class _Record(NamedTuple):
    """One record as the gateway wrote it (``gateway.serve.proxy.Answer.record``), read back."""

    at: datetime
    user: int
    key: Any
    channel: Any
    reservation: Any
    model: str
    method: str
    path: str
    status: int
    ttft: float | None
    duration: float
    prompt: int
    completion: int
    served: str
    queued: float | None
    request_id: str
    decided: float | None
    code: str
    reason: str
    item: bytes
    borrowed: bool = False


def _rows(raw: list[bytes]) -> tuple[list[tuple[Any, bytes]], list[bytes]]:
    """Rows for the records that parse, each with its record, their references checked (a user,
    key, channel or reservation deleted meanwhile: the row keeps what still exists); and the
    records that do not parse or hold text no database stores."""
    from channels_app.models import Channel
    from gateway.models import ApiKey, RequestLog
    from reservations.models import Reservation

    records: list[_Record] = []
    dead: list[bytes] = []
    for item in raw:
        try:
            fields = json.loads(item)
            if isinstance(fields, list) and len(fields) == 13:  # written before the served model was kept
                fields.append("")
            if isinstance(fields, list) and len(fields) == 14:  # written before waits were kept
                fields.append(None)
            if isinstance(fields, list) and len(fields) == 15:  # written before requests had ids
                fields.append("")
            if isinstance(fields, list) and len(fields) == 16:  # written before decisions were timed
                fields.append(None)
            if isinstance(fields, list) and len(fields) == 17:  # written before refusals were kept
                fields += ["", ""]
            if isinstance(fields, list) and len(fields) == 19:  # written before slots were lent
                fields.append(False)
            (
                at,
                user,
                api_key,
                channel,
                reservation,
                model,
                method,
                path,
                status,
                ttft,
                duration,
                i,
                o,
                served,
                queued,
                request_id,
                decided,
                code,
                reason,
                borrowed,
            ) = fields
            record = _Record(
                datetime.fromtimestamp(float(at), tz=UTC),
                int(user),
                api_key,
                channel,
                reservation,
                str(model),
                str(method),
                str(path),
                int(status),
                None if ttft is None else float(ttft),
                float(duration),
                int(i),
                int(o),
                str(served),
                None if queued is None else float(queued),
                str(request_id)[:40],
                None if decided is None else float(decided),
                str(code)[:40],
                str(reason)[:300],
                item,
                borrowed is True,
            )
            if not all(
                _storable(text)
                for text in (
                    record.model,
                    record.method,
                    record.path,
                    record.served,
                    record.request_id,
                    record.code,
                    record.reason,
                )
            ):
                raise ValueError("text no database stores")
            records.append(record)
        except (ValueError, TypeError):
            log.warning("request log: set aside a record it cannot write %r", item[:200])
            dead.append(item)
    users = set(
        get_user_model().objects.filter(pk__in={r.user for r in records}).values_list("pk", flat=True)
    )
    keys = set(ApiKey.objects.filter(pk__in={r.key for r in records if r.key}).values_list("pk", flat=True))
    channels = set(
        Channel.objects.filter(pk__in={r.channel for r in records if r.channel}).values_list("pk", flat=True)
    )
    reservations = set(
        Reservation.objects.filter(pk__in={r.reservation for r in records if r.reservation}).values_list(
            "pk", flat=True
        )
    )
    rows = [
        (
            RequestLog(
                at=r.at,
                user_id=r.user,
                key_id=r.key if r.key in keys else None,
                channel_id=r.channel if r.channel in channels else None,
                reservation_id=r.reservation if r.reservation in reservations else None,
                model=r.model,
                method=r.method[:10],
                path=r.path,
                status=r.status,
                ttft_ms=r.ttft,
                duration_ms=r.duration,
                prompt_tokens=max(r.prompt, 0),
                completion_tokens=max(r.completion, 0),
                served_model=r.served[:200],
                queued_ms=r.queued,
                request_id=r.request_id,
                decided_ms=r.decided,
                error_code=r.code,
                error=r.reason,
                borrowed=r.borrowed,
            ),
            r.item,
        )
        for r in records
        if r.user in users
    ]
    return rows, dead


def _storable(text: str) -> bool:
    """Text every database stores: UTF-8, without NUL (which PostgreSQL refuses)."""
    return "\x00" not in text and is_unicode(text)
