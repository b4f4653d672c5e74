"""The request log, from Redis into the database: the gateway pushes one record per request
(``gateway.counters.LEAVE``, off the hot path's database), and the periodic flush writes them
in batches and drops rows older than ``SLOTSERVE_REQUEST_LOG_DAYS``."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from channels_app.vocabulary import RedisKey
from channels_app.vocabulary import redis_key as key

log = logging.getLogger(__name__)

BATCH = 1000
MAX_BATCHES = 50  # per flush; the rest waits for the next one


def flush_request_log(client: redis.Redis, *, now: datetime | None = None) -> int:
    """Write the waiting records as rows; returns how many. A batch leaves Redis only once its
    rows are saved, so a database that fails keeps them for the next flush."""
    from gateway.models import RequestLog

    name = key(RedisKey.REQUEST_LOG, "all")
    written = 0
    for _ in range(MAX_BATCHES):
        raw: Any = client.lrange(name, 0, BATCH - 1)
        if not raw:
            break
        rows = _rows([bytes(r) for r in raw])
        with transaction.atomic():
            RequestLog.objects.bulk_create(rows)
        client.ltrim(name, len(raw), -1)
        written += len(rows)
    moment = now or timezone.now()
    RequestLog.objects.filter(at__lt=moment - timedelta(days=settings.SLOTSERVE_REQUEST_LOG_DAYS)).delete()
    return written


def _rows(raw: list[bytes]) -> list[Any]:
    """Rows for the records that parse, their references checked (a user, key, channel or
    reservation deleted meanwhile: the row keeps what still exists)."""
    from channels_app.models import Channel
    from gateway.models import ApiKey, RequestLog
    from reservations.models import Reservation

    records = []
    for item in raw:
        try:
            fields = json.loads(item)
            at, user, api_key, channel, reservation, model, method, path, status, ttft, duration, i, o = (
                fields
            )
            records.append(
                (
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
                )
            )
        except (ValueError, TypeError):
            log.warning("request log: dropped a malformed record %r", item[:200])
    users = set(get_user_model().objects.filter(pk__in={r[1] for r in records}).values_list("pk", flat=True))
    keys = set(ApiKey.objects.filter(pk__in={r[2] for r in records if r[2]}).values_list("pk", flat=True))
    channels = set(
        Channel.objects.filter(pk__in={r[3] for r in records if r[3]}).values_list("pk", flat=True)
    )
    reservations = set(
        Reservation.objects.filter(pk__in={r[4] for r in records if r[4]}).values_list("pk", flat=True)
    )
    return [
        RequestLog(
            at=at,
            user_id=user,
            key_id=api_key if api_key in keys else None,
            channel_id=channel if channel in channels else None,
            reservation_id=reservation if reservation in reservations else None,
            model=model,
            method=method[:10],
            path=path,
            status=status,
            ttft_ms=ttft,
            duration_ms=duration,
            prompt_tokens=max(i, 0),
            completion_tokens=max(o, 0),
        )
        for (at, user, api_key, channel, reservation, model, method, path, status, ttft, duration, i, o) in (
            records
        )
        if user in users
    ]
