"""The lab's webhook receivers in ``bench/chaos_week.py``, and the checker of promise 4: every
event reaches each webhook that hears of it, at least once, under one ``webhook-id``, in order
per object, through every fault.

Three receivers listen on ``RECEIVER_HOST`` (a loopback address the lab allows webhooks to
reach, ``SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS``): ``fast`` answers 204 at once; ``slow`` takes up
to 2.5 s (past the lab's 2 s deadline now and then: SlotServe counts a failed try, the receiver
has handled it, and the retry comes under the same ``webhook-id``); ``flaky`` answers 500 to one
try in four. The fault "slow webhook receiver" makes ``slow`` hang past the deadline on every
try for a while."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RECEIVER_HOST = "127.0.0.2"
# The lab's delivery settings: a 2 s deadline, and nine tries over about 30 s.
WEBHOOK_ENV = {
    "SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS": f"{RECEIVER_HOST}/32",
    "SLOTSERVE_WEBHOOK_TIMEOUT_SECONDS": "2",
    "SLOTSERVE_WEBHOOK_RETRY_SECONDS": "1,1,2,2,3,5,5,10",
}
DEADLINE = 2.0
# Events a booking has at most one of (more than one id for them: the happening told twice).
ONCE_PER_BOOKING = (
    "booking.approved",
    "booking.cancelled",
    "booking.started",
    "booking.ended",
    "booking.ended_early",
)


@dataclass
class Got:
    msg_id: str
    at: float  # time.time() when it came
    accepted: bool  # the receiver handled it (whether or not SlotServe heard its answer in time)
    type: str
    booking: int | None  # the booking it is about, if any


@dataclass
class LabReceiver:
    kind: str  # "fast", "slow" or "flaky"
    seed: int
    got: list[Got] = field(default_factory=list)
    stalled_until: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                receiver.answer(self, body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((RECEIVER_HOST, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{RECEIVER_HOST}:{self.server.server_port}/{self.kind}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        try:
            event = json.loads(body)
            booking = (event.get("data") or {}).get("booking") or {}
            kind, about = str(event.get("type")), booking.get("id") if isinstance(booking, dict) else None
        except ValueError:
            kind, about = "(not JSON)", None
        with self.lock:
            stalled = time.time() < self.stalled_until
            fails = self.kind == "flaky" and self.rng.random() < 0.25
            slow = self.kind == "slow" and self.rng.random() < 0.1
            pause = self.rng.uniform(0, DEADLINE * 1.25) if slow else 0.0
        got = Got(handler.headers.get("webhook-id", ""), time.time(), not (stalled or fails), kind, about)
        with self.lock:
            self.got.append(got)
        if stalled:
            time.sleep(DEADLINE * 2)  # past the deadline: SlotServe gives up on this try
            handler.close_connection = True
            return
        time.sleep(pause)
        try:
            handler.send_response(500 if fails else 204)
            handler.end_headers()
        except OSError:
            pass  # SlotServe gave up waiting: it retries, under the same webhook-id

    def stall(self, seconds: float) -> None:
        with self.lock:
            self.stalled_until = time.time() + seconds

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def drained(webhook_ids: list[int], timeout: float) -> bool:
    """Wait until none of these webhooks' deliveries waits for a try (or ``timeout`` passes)."""
    from django.db import DatabaseError, connection

    from reservations.webhooks.models import Delivery, DeliveryState

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if not Delivery.objects.filter(webhook_id__in=webhook_ids, state=DeliveryState.PENDING).exists():
                return True
        except DatabaseError:
            connection.close()
        time.sleep(0.5)
    return False


def check_webhooks(
    receivers: dict[int, LabReceiver],
    expected: dict[int, set[str]],
    violated: Callable[[float, str], None],
    checked: Callable[[int], None],
) -> dict[str, int]:
    """Promise 4, for each webhook (by id) and its receiver. ``expected``: booking id → the
    events of it that the lab's own calls and clock say happened (checked at the receiver that
    hears of every event, ``fast``)."""
    from reservations.webhooks.models import Delivery

    totals = {"deliveries": 0, "received": 0}
    for webhook_id, receiver in receivers.items():
        deliveries = list(
            Delivery.objects.filter(webhook_id=webhook_id, redelivery_of=None)
            .select_related("event")
            .order_by("pk")
        )
        with receiver.lock:
            got = list(receiver.got)
        accepted: dict[str, Got] = {}
        for item in got:
            if item.accepted and item.msg_id not in accepted:
                accepted[item.msg_id] = item
        totals["deliveries"] += len(deliveries)
        totals["received"] += len(accepted)
        # At least once.
        for delivery in deliveries:
            checked(1)
            if delivery.event.msg_id not in accepted:
                violated(
                    delivery.event.at.timestamp(),
                    f"{delivery.event.type} ({delivery.event.subject}) never reached the {receiver.kind} "
                    f"receiver: {delivery.state} after {delivery.tries} tries",
                )
        # In order per object: the first handling of each event follows the order of its deliveries.
        order = {d.event.msg_id: (d.event.subject, d.pk) for d in deliveries}
        last: dict[str, tuple[int, str]] = {}
        for item in sorted(accepted.values(), key=lambda g: g.at):
            if item.msg_id not in order:
                continue
            subject, number = order[item.msg_id]
            before = last.get(subject)
            if before is not None and before[0] > number:
                violated(
                    item.at,
                    f"the {receiver.kind} receiver had {item.type} of {subject} before {before[1]}, "
                    "which happened first",
                )
            last[subject] = (max(number, before[0]) if before else number, item.type)
        # One webhook-id per happening.
        ids: dict[tuple[str, int], set[str]] = {}
        for item in got:
            if item.type in ONCE_PER_BOOKING and item.booking is not None:
                ids.setdefault((item.type, item.booking), set()).add(item.msg_id)
        for (kind, booking), seen in ids.items():
            checked(1)
            if len(seen) > 1:
                violated(time.time(), f"booking {booking}'s {kind} came under {len(seen)} webhook-ids")
        if receiver.kind != "fast":
            continue
        # Every event the lab's calls and clock made, told.
        have: dict[int, set[str]] = {}
        for item in accepted.values():
            if item.booking is not None:
                have.setdefault(item.booking, set()).add(item.type)
        for booking, events in expected.items():
            for kind in sorted(events - have.get(booking, set())):
                checked(1)
                violated(time.time(), f"booking {booking}'s {kind} never reached the fast receiver")
            checked(len(events & have.get(booking, set())))
    return totals
