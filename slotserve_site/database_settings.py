"""The database settings: SQLite in the data directory by default, or what ``DATABASE_URL`` names,
each with the options SlotServe needs (docs/settings.md, docs/deploy.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dj_database_url

from slotserve_base.env import SettingError, env_float, env_int


def databases(url: str, data_dir: Path) -> dict[str, Any]:
    """Django's ``DATABASES`` for ``DATABASE_URL`` (``url``; empty: SQLite in ``data_dir``)."""
    if url:
        try:
            chosen: dict[str, Any] = {"default": dj_database_url.parse(url, conn_max_age=60)}
        except ValueError as exc:
            raise SettingError(f"DATABASE_URL is not a database URL: {exc}") from None
        if chosen["default"]["ENGINE"] == "django.db.backends.sqlite3":
            named = Path(str(chosen["default"]["NAME"]))
            # The tests' database beside it, a file too (threads need SQLite's real locking).
            chosen["default"] = {
                **_sqlite(str(named)),
                "TEST": {"NAME": str(named.with_name(f"test_{named.name}"))},
            }
        elif chosen["default"]["ENGINE"] == "django.db.backends.postgresql":
            # A database behind a network that goes silent must not hang a node worker or the
            # gateway's snapshot for minutes: give up connecting after 5 s, and notice a dead
            # connection within about 25 s (TCP keepalives). The URL's own options win.
            # Connections come from a pool of at most SLOTSERVE_DB_POOL_SIZE per process: under
            # ASGI every request runs in a thread of its own, and a connection kept per thread ran
            # PostgreSQL out of connections with 20 colleagues browsing (docs/deploy.md, "Database
            # connections"). A request that finds the pool busy waits up to SLOTSERVE_DB_POOL_TIMEOUT
            # (20 s) for a connection, then answers 503 with Retry-After (slotserve_site.busy).
            chosen["default"]["CONN_MAX_AGE"] = 0  # the pool keeps them
            # Each connection is checked as it leaves the pool (one round trip): after a database
            # restart the pool's dead connections are replaced, not handed to the next requests
            # to fail with (docs/deploy.md, "Database connections").
            chosen["default"]["CONN_HEALTH_CHECKS"] = True
            chosen["default"]["OPTIONS"] = {
                "connect_timeout": 5,
                "keepalives": 1,
                "keepalives_idle": 10,
                "keepalives_interval": 5,
                "keepalives_count": 3,
                "pool": {
                    "min_size": 1,
                    "max_size": env_int("SLOTSERVE_DB_POOL_SIZE", 10, minimum=1),
                    "timeout": env_float("SLOTSERVE_DB_POOL_TIMEOUT", 20.0, minimum=0.1),
                },
                **chosen["default"].get("OPTIONS", {}),
            }
    else:
        chosen = {
            "default": {
                **_sqlite(str(data_dir / "slotserve.sqlite3")),
                # A file, not shared-cache memory: threads in the concurrency tests
                # need SQLite's real locking, which shared cache does not provide.
                "TEST": {"NAME": str(data_dir / "test.sqlite3")},
            }
        }
    return chosen


def _sqlite(name: str) -> dict[str, Any]:
    """SQLite as SlotServe needs it, wherever the file is (the default, or a ``sqlite:///`` URL).

    BEGIN IMMEDIATE takes the write lock at the start of every transaction, so the overlap
    check and the insert of a reservation cannot interleave with another writer's
    (docs/scheduling.md, "Booking"); a writer waits up to 20 s for the lock instead of failing
    at once; WAL lets readers go on while one writes."""
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": name,
        "CONN_MAX_AGE": 0,
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
