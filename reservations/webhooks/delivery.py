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
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from standardwebhooks.webhooks import Webhook as Signer

from reservations.notifications import notify
from reservations.webhooks.addresses import Refused, destination
from reservations.webhooks.models import Delivery, DeliveryState, DeliveryTry, Webhook
from reservations.webhooks.sender import Answer, Sender
from slotserve_base import overview
from slotserve_base.vocabulary import NotificationEvent, WebhookEvent

log = logging.getLogger(__name__)

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
