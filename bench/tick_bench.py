#!/usr/bin/env python
"""Benchmark: one scheduler tick over many channels with many reservations each.

    .venv/bin/python bench/tick_bench.py                  # SQLite in a temporary folder
    .venv/bin/python bench/tick_bench.py --postgres URL   # a scratch database on that server

Builds 10 channels, measures a tick; grows to 1,000 channels, measures
again. Each channel has 100 approved reservations (one active now, the rest
ahead) and a few recorded loads. Reports the time of the first tick (which
writes every target) and of steady ticks (nothing changes), and the number
of SQL queries of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def configure(postgres: str | None) -> str:
    if postgres:
        import psycopg

        admin = psycopg.connect(postgres, autocommit=True)
        admin.execute("DROP DATABASE IF EXISTS slotserve_bench")
        admin.execute("CREATE DATABASE slotserve_bench")
        admin.close()
        base = postgres.rsplit("/", 1)[0]
        os.environ["DATABASE_URL"] = f"{base}/slotserve_bench"
        return "PostgreSQL"
    os.environ.pop("DATABASE_URL", None)
    os.environ["SLOTSERVE_DATA_DIR"] = tempfile.mkdtemp(prefix="slotserve-bench-")
    return "SQLite"


def populate(first: int, count: int, reservations: int, now: Any) -> None:
    from django.contrib.auth import get_user_model

    from channels_app.models import Channel, Gpu, LLMModel, LoadRecord, Node, Preset
    from reservations.models import Reservation

    user, _ = get_user_model().objects.get_or_create(username="bench")
    node, created = Node.objects.get_or_create(name="bench-node", defaults={"last_heartbeat": now})
    if created:
        Gpu.objects.create(node=node, index=0, memory_bytes=80 * 2**30)
        for name in ("default", "booked"):
            model = LLMModel.objects.create(
                name=name, backend="llama.cpp", path=f"/m/{name}", size_bytes=8 * 10**9
            )
            Preset.objects.create(model=model, name="p")
    default = Preset.objects.get(model__name="default")
    booked = Preset.objects.get(model__name="booked")
    channels = Channel.objects.bulk_create(
        Channel(
            name=f"ch{i:04d}",
            node=node,
            gpu_indexes=[0],
            default_model_id=default.model_id,
            default_preset=default,
        )
        for i in range(first, first + count)
    )
    rows = []
    loads = []
    for channel in channels:
        for k in range(reservations):
            # One active now, then one hour booked every two hours.
            start = now - timedelta(minutes=30) + timedelta(hours=2 * k)
            rows.append(
                Reservation(
                    user=user,
                    channel=channel,
                    start=start,
                    end=start + timedelta(hours=1),
                    model_id=booked.model_id,
                    preset=booked,
                    status="approved",
                )
            )
        for k in range(3):
            started = now - timedelta(days=1, hours=k)
            loads.append(
                LoadRecord(
                    model_id=booked.model_id,
                    preset=booked,
                    node=node,
                    channel=channel,
                    started=started,
                    finished=started + timedelta(seconds=40 + k),
                    succeeded=True,
                )
            )
    Reservation.objects.bulk_create(rows, batch_size=2000)
    LoadRecord.objects.bulk_create(loads, batch_size=2000)
    # Fresh statistics, as autovacuum (PostgreSQL) keeps them in a running system.
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def measure(now: Any, steady_runs: int) -> dict[str, float]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from channels_app.scheduling.services import decide_channels

    def one(moment: Any) -> tuple[float, int, int]:
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            result = decide_channels(now=moment)
            elapsed = time.perf_counter() - started
        return elapsed, len(captured), len(result.changed)

    first, first_queries, changed = one(now)
    steady = [one(now + timedelta(seconds=5 * (i + 1))) for i in range(steady_runs)]
    return {
        "first_s": first,
        "first_queries": first_queries,
        "first_changed": changed,
        "steady_s": statistics.median(s[0] for s in steady),
        "steady_queries": steady[-1][1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--postgres", metavar="URL", help="e.g. postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--channels", type=int, default=1000)
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--reservations", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    database = configure(args.postgres)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "slotserve_site.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.utils import timezone

    settings.DEBUG = False
    call_command("migrate", verbosity=0)
    now = timezone.now().replace(microsecond=0)

    populate(0, args.small, args.reservations, now)
    small = measure(now, args.runs)
    populate(args.small, args.channels - args.small, args.reservations, now)
    large = measure(now + timedelta(minutes=1), args.runs)

    print(f"database: {database}; {args.reservations} reservations per channel")
    print(f"{'channels':>9} {'first tick':>11} {'queries':>8} {'steady tick':>12} {'queries':>8}")
    for count, r in ((args.small, small), (args.channels, large)):
        print(
            f"{count:>9} {r['first_s'] * 1000:>9.1f}ms {r['first_queries']:>8} "
            f"{r['steady_s'] * 1000:>10.1f}ms {r['steady_queries']:>8}"
        )


if __name__ == "__main__":
    main()
