#!/usr/bin/env python
"""Benchmark: what webhooks cost a booking, and how fast deliveries leave (docs/webhooks.md).

    .venv/bin/python bench/webhook_bench.py [--bookings 200] [--webhooks 5]

1. A booking's own time (``reservation_create``, which announces ``booking.requested`` and
   ``booking.approved``) with nobody listening (a booking's cost before webhooks), with no
   webhook (each event looked up, none kept), and with ``--webhooks`` staff webhooks hearing of
   every event: the events and their deliveries are stored in the booking's transaction.
2. One webhook's deliveries of those events to a local receiver that answers 204 at once
   (``delivery.deliver``, one deliverer, in order): deliveries per second.

SQLite in a fresh data directory, as the default setup runs. Needs Redis (the booking services
read nothing of it, the notices' tasks are not sent).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gateway_bench import bench_database  # noqa: E402


class Quiet(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def book_many(count: int, start_hour: int) -> list[float]:
    """Milliseconds per booking, ``count`` bookings an hour apart."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from channels_app.models import Channel
    from reservations.services import NewBooking, reservation_create

    user = get_user_model().objects.get(username="bench")
    channel = Channel.objects.get(name="bench")
    base = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(days=1)
    times = []
    for i in range(count):
        start = base + timedelta(hours=start_hour + i)
        began = time.perf_counter()
        reservation_create(
            NewBooking(
                user=user, channel=channel, start=start, end=start + timedelta(minutes=30), exclusive=True
            ),
            now=timezone.now(),
        )
        times.append((time.perf_counter() - began) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bookings", type=int, default=200)
    parser.add_argument("--webhooks", type=int, default=5)
    options = parser.parse_args()
    bench_database("whbench")
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from reservations.webhooks import delivery
    from reservations.webhooks.models import Delivery, DeliveryState
    from reservations.webhooks.services import webhook_create
    from slotserve_base import dispatch
    from tests import factories

    settings.SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.SLOTSERVE_LIMIT_WEEKLY_TOKENS = 0
    sent: list[tuple[str, Any]] = []
    # Nothing is sent while the bookings are made: the deliveries are measured on their own.
    dispatch.send = lambda name, **options: sent.append((name, options))
    dispatch.enqueue_redecide = lambda channel_id: None
    get_user_model().objects.create_user("bench", is_staff=True)
    channel = factories.channel("bench")
    channel.allow_whole_card = True
    channel.save()

    from reservations.webhooks.listen import on_happening
    from slotserve_base.happenings import Happening, happened

    # The booking alone: nobody listens (what a booking cost before webhooks).
    happened.disconnect(
        on_happening, sender=Happening, dispatch_uid="reservations.webhooks.listen.on_happening"
    )
    alone = book_many(options.bookings, 0)
    happened.connect(on_happening, sender=Happening, dispatch_uid="reservations.webhooks.listen.on_happening")
    without = book_many(options.bookings, options.bookings + 1)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/hook"
    owner = get_user_model().objects.get(username="bench")
    hooks = [webhook_create(owner=owner, url=url, scope="all") for _ in range(options.webhooks)]
    with_hooks = book_many(options.bookings, 2 * options.bookings + 2)

    began = time.perf_counter()
    tried = delivery.deliver(hooks[0].pk)
    while True:
        more = delivery.deliver(hooks[0].pk)
        if not more:
            break
        tried += more
    seconds = time.perf_counter() - began
    delivered = Delivery.objects.filter(webhook=hooks[0], state=DeliveryState.DELIVERED).count()
    server.shutdown()

    def line(name: str, times: list[float]) -> str:
        q = statistics.quantiles(times, n=20)
        return f"{name:<34} p50 {statistics.median(times):6.2f} ms   p95 {q[18]:6.2f} ms"

    print(f"{options.bookings} bookings, each announcing 2 events (SQLite)")
    print(line("a booking, its events told nobody", alone))
    print(line("a booking, no webhook", without))
    print(line(f"a booking, {options.webhooks} webhooks hearing of it", with_hooks))
    print(
        f"one webhook's deliveries: {delivered} delivered of {tried} tried in {seconds:.2f} s "
        f"= {tried / seconds:.0f} per second, in order"
    )


if __name__ == "__main__":
    main()
