"""Sending deliveries (docs/webhooks.md, "Delivery"): signed as Standard Webhooks says, retried
with growing pauses for about a day, in order per object, never again after a 2xx; a webhook
whose receiver keeps failing is paused and its owner told.

One deliverer at a time per webhook: it claims the webhook with a lease in the database
(``Webhook.lease_until``), so two workers never send the same delivery at once, and the
deliveries of one object (a booking, a channel) leave in the order they happened.
"""

from __future__ import annotations

import functools
import logging
import math
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpcore
import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from standardwebhooks.webhooks import Webhook as Signer

from reservations.notifications import notify
from reservations.webhooks.addresses import Refused, destination
from reservations.webhooks.models import Delivery, DeliveryState, DeliveryTry, Webhook
from slotserve_base import overview
from slotserve_base.vocabulary import NotificationEvent, WebhookEvent

log = logging.getLogger(__name__)

# The first bytes of an answer the delivery log keeps, and the most of an answer a try reads:
# the rest is never read (a receiver's 200 MB answer costs a worker nothing), and an answer
# longer than that closes its connection rather than returning it to the pool.
ANSWER_KEPT = 500
ANSWER_READ = 64 * 1024
# Deliveries one run sends at most, and for how long it starts new ones; the rest wait for the
# next run (a receiver that takes its whole timeout each time must not hold a worker for hours).
PER_RUN = 200
RUN_SECONDS = 300.0
# Failed tries in a row after which a run stops: the receiver is down or slow, its deliveries
# wait for their retries (``webhooks_due``), and the worker goes to other webhooks.
FAILURES_PER_RUN = 3
USER_AGENT = "SlotServe-Webhooks/1"


def next_try(tries: int, now: datetime, pauses: list[float]) -> datetime | None:
    """When a delivery that failed its ``tries``-th try is tried again; None when that was the
    last (``pauses``: the seconds before each retry)."""
    if tries > len(pauses):
        return None
    return now + timedelta(seconds=pauses[tries - 1])


def succeeded(status: int | None) -> bool:
    return status is not None and 200 <= status < 300


@dataclass(frozen=True)
class Answer:
    status: int | None
    duration_ms: float
    text: str
    error: str


def headers_for(webhook: Webhook, msg_id: str, body: str, sent: datetime) -> dict[str, str]:
    """The Standard Webhooks headers: ``webhook-id`` (the event's, the same on every try),
    ``webhook-timestamp`` (this try's) and ``webhook-signature`` (HMAC-SHA256 with the secret)."""
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(sent.timestamp())),
        "webhook-signature": Signer(webhook.secret).sign(msg_id, sent, body),
    }


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every delivery of this process (making one reads the CA bundle)."""
    return httpx.create_ssl_context()


class _Deadline:
    """The moment a try must be over; every step of the connection asks it how long it may take."""

    def __init__(self) -> None:
        self.at = math.inf

    def left(self, timeout: float | None, late: type[Exception]) -> float:
        """``timeout`` cut to what is left of the try; ``late`` raised when nothing is."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise late("the delivery's deadline passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write ends by the try's deadline."""

    def __init__(self, inner: httpcore.NetworkStream, deadline: _Deadline) -> None:
        self._inner, self._deadline = inner, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._deadline.left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._deadline.left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        limit = self._deadline.left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, limit), self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own network backend, each connection's steps cut to the try's deadline."""

    def __init__(self, deadline: _Deadline) -> None:
        self._inner, self._deadline = httpcore.SyncBackend(), deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        limit = self._deadline.left(timeout, httpcore.ConnectTimeout)
        inner = self._inner.connect_tcp(host, port, limit, local_address, socket_options)
        return _DeadlineStream(inner, self._deadline)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.UnsupportedProtocol("webhooks are sent over TCP")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class Sender:
    """Sends a run's deliveries over one pool of connections, each try within its deadline.

    The deadline, ``SLOTSERVE_WEBHOOK_TIMEOUT_SECONDS``, is the whole of a try: connecting,
    sending and reading the answer. A client's timeouts are per step (a receiver that sends a
    byte every few seconds never trips a read timeout), so the connections come from a network
    backend of httpcore's (httpx's own core) whose every read and write is cut to what is left
    of the try, and fails once nothing is. Measured against an event loop cancelling the try,
    this keeps the plain client's pace (``bench/webhook_bench.py``)."""

    def __init__(self) -> None:
        self._deadline = _Deadline()
        timeout = float(settings.SLOTSERVE_WEBHOOK_TIMEOUT_SECONDS)
        self._timeouts = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
        # No proxies from the environment, no redirects followed (httpcore follows none).
        self._pool = httpcore.ConnectionPool(
            ssl_context=_tls(), max_connections=4, network_backend=_DeadlineBackend(self._deadline)
        )

    def post(self, url: str, body: bytes, headers: dict[str, str], extensions: dict[str, str]) -> Answer:
        """One POST; its status and first bytes, or what went wrong."""
        began = time.monotonic()
        whole = float(settings.SLOTSERVE_WEBHOOK_TIMEOUT_SECONDS)
        self._deadline.at = began + whole
        sent = [(name.encode(), value.encode()) for name, value in headers.items()]
        # Answers uncompressed, so that the bytes read are the bytes received.
        sent += [(b"content-length", str(len(body)).encode()), (b"accept-encoding", b"identity")]
        try:
            with self._pool.stream(
                "POST", url, headers=sent, content=body, extensions={"timeout": self._timeouts, **extensions}
            ) as answer:
                first = bytearray()
                for chunk in answer.iter_stream():
                    first += chunk
                    if len(first) >= ANSWER_READ:
                        break
                status = answer.status
        except httpcore.TimeoutException as exc:
            took = time.monotonic() - began
            if took >= whole:
                return Answer(None, took * 1000, "", f"no whole answer within {whole:g} s (the deadline)")
            return Answer(None, took * 1000, "", f"{type(exc).__name__}: {exc}"[:ANSWER_KEPT])
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
            what = type(exc).__name__
            return Answer(None, (time.monotonic() - began) * 1000, "", f"{what}: {exc}"[:ANSWER_KEPT])
        finally:
            self._deadline.at = math.inf
        text = bytes(first[:ANSWER_KEPT]).decode("utf-8", errors="replace")
        return Answer(status, (time.monotonic() - began) * 1000, text, "")

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def send(delivery: Delivery, sender: Sender) -> Answer:
    """One try: POST the body to the checked address; what came back, or what went wrong."""
    webhook = delivery.webhook
    try:
        where = destination(webhook.url)
    except Refused as exc:
        return Answer(None, 0.0, "", f"refused: {exc}")
    headers = headers_for(webhook, delivery.event.msg_id, delivery.body, timezone.now())
    headers["host"] = where.host
    extensions = {"sni_hostname": where.tls_name} if where.tls_name else {}
    return sender.post(where.url, delivery.body.encode(), headers, extensions)


def claim(webhook_id: int, now: datetime, seconds: float) -> bool:
    """Take the webhook for a run (or renew the claim); False while another deliverer has it."""
    until = now + timedelta(seconds=seconds)
    return bool(
        Webhook.objects.filter(pk=webhook_id, paused_at__isnull=True)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .update(lease_until=until)
    )


def lease_seconds() -> float:
    return float(settings.SLOTSERVE_WEBHOOK_TIMEOUT_SECONDS) + 30.0


def deliver(webhook_id: int) -> int:
    """Send the webhook's due deliveries, oldest first; returns how many were tried.

    A delivery waits while an older one of the same object is still to be delivered, so that
    a receiver hears of a booking approved before it hears of it started."""
    if not claim(webhook_id, timezone.now(), lease_seconds()):
        return 0
    tried = failures = 0
    stop_at = time.monotonic() + RUN_SECONDS
    sender = Sender()
    try:
        waiting: set[str] = set()  # objects with an older delivery still to go
        pending = (
            Delivery.objects.filter(webhook_id=webhook_id, state=DeliveryState.PENDING)
            .exclude(event__type=WebhookEvent.TEST)
            .select_related("event", "webhook__owner")
            .order_by("pk")[:PER_RUN]
        )
        for delivery in pending:
            if time.monotonic() >= stop_at:
                break
            subject = delivery.event.subject
            if subject in waiting:
                continue
            now = timezone.now()
            if delivery.next_try_at > now:
                waiting.add(subject)
                continue
            # Renew the claim, and stop once the webhook is paused (by this run's last try, or
            # by its owner meanwhile): one statement for both.
            renewed = Webhook.objects.filter(pk=webhook_id, paused_at__isnull=True).update(
                lease_until=now + timedelta(seconds=lease_seconds())
            )
            if not renewed:
                break
            answer = send(delivery, sender)
            tried += 1
            if record(delivery, answer, timezone.now()):
                failures = 0
            else:
                waiting.add(subject)
                failures += 1
                if failures >= FAILURES_PER_RUN:
                    break
    finally:
        sender.close()
        Webhook.objects.filter(pk=webhook_id).update(lease_until=None)
        owner_id = Webhook.objects.filter(pk=webhook_id).values_list("owner_id", flat=True).first()
        if tried and owner_id is not None:
            overview.deliveries_changed(owner_id, webhook_id)  # its log, on the owner's open pages
    return tried


def _keep_try(delivery: Delivery, answer: Answer, now: datetime) -> None:
    DeliveryTry.objects.create(
        delivery=delivery,
        at=now,
        status_code=answer.status,
        duration_ms=round(answer.duration_ms, 1),
        answer=answer.text,
        error=answer.error,
    )
    delivery.tries += 1


def send_test(delivery_id: int) -> bool:
    """A test event's one try, paused webhook or not; no retry, no pause: its owner reads the
    answer in the log. True when it was delivered."""
    delivery = (
        Delivery.objects.select_related("event", "webhook__owner")
        .filter(pk=delivery_id, state=DeliveryState.PENDING)
        .first()
    )
    if delivery is None:
        return False
    with Sender() as sender:
        answer = send(delivery, sender)
    now = timezone.now()
    with transaction.atomic():
        _keep_try(delivery, answer, now)
        if succeeded(answer.status):
            delivery.state, delivery.delivered_at = DeliveryState.DELIVERED, now
        else:
            delivery.state = DeliveryState.FAILED
        delivery.save(update_fields=["tries", "state", "delivered_at"])
    overview.deliveries_changed(delivery.webhook.owner_id, delivery.webhook_id)
    return delivery.state == DeliveryState.DELIVERED


def record(delivery: Delivery, answer: Answer, now: datetime) -> bool:
    """Keep the try in the log and what follows from it; True when it was delivered."""
    with transaction.atomic():
        _keep_try(delivery, answer, now)
        if succeeded(answer.status):
            delivery.state, delivery.delivered_at = DeliveryState.DELIVERED, now
            delivery.save(update_fields=["tries", "state", "delivered_at"])
            return True
        if answer.status == 410:
            # "Gone": the receiver says it will never take it (Standard Webhooks): pause now.
            delivery.save(update_fields=["tries"])
            pause(delivery.webhook, now, "the receiver answered 410 Gone")
            return False
        retry_at = next_try(delivery.tries, now, list(settings.SLOTSERVE_WEBHOOK_RETRY_SECONDS))
        if retry_at is None:
            delivery.state = DeliveryState.FAILED
            delivery.save(update_fields=["tries", "state"])
            what = f"status {answer.status}" if answer.status is not None else answer.error
            pause(delivery.webhook, now, f"{delivery.tries} tries of one event failed, the last with {what}")
        else:
            delivery.next_try_at = retry_at
            delivery.save(update_fields=["tries", "next_try_at"])
        return False


def pause(webhook: Webhook, now: datetime, reason: str) -> None:
    """Stop sending to ``webhook`` and tell its owner; its waiting deliveries keep until it is
    resumed."""
    paused = Webhook.objects.filter(pk=webhook.pk, paused_at__isnull=True).update(
        paused_at=now, paused_reason=reason
    )
    if not paused:
        return
    log.warning("webhook %s (%s) paused: %s", webhook.pk, webhook.url, reason)
    notify(
        user=webhook.owner,
        event=NotificationEvent.WEBHOOK_PAUSED,
        text=f"Your webhook {webhook} was paused: {reason}. Resume it on the webhooks page once "
        "its receiver answers again.",
        link="/webhooks/",
        key=f"webhook_paused:{webhook.pk}:{now:%Y%m%dT%H%M%S.%f}",
    )


def due_webhooks(now: datetime) -> list[int]:
    """Webhooks, not paused, with a delivery due now."""
    return list(
        Webhook.objects.filter(
            paused_at__isnull=True,
            deliveries__event__type__in=[t for t in WebhookEvent.values if t != WebhookEvent.TEST],
            deliveries__state=DeliveryState.PENDING,
            deliveries__next_try_at__lte=now,
        )
        .distinct()
        .values_list("pk", flat=True)
    )
