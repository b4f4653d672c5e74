"""What ``/health`` checks: the database and Redis, each answered with "ok" or what is wrong."""

from __future__ import annotations

import redis
from django.conf import settings
from django.db import DatabaseError, connection
from redis.exceptions import RedisError


def check_dependencies() -> dict[str, str]:
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except DatabaseError as exc:
        checks["database"] = f"unreachable: {exc}".strip()
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1)
        client.ping()
        client.close()
        checks["redis"] = "ok"
    except (RedisError, OSError) as exc:
        checks["redis"] = f"unreachable: {exc}"
    return checks
