"""Making, changing and testing webhooks; every write of a webhook goes through here
(docs/webhooks.md)."""

from __future__ import annotations

import base64
import math
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q

from channels_app.models import Channel
from reservations.webhooks.addresses import Refused, Unresolved, addresses_of, check_url
from reservations.webhooks.listen import store
from reservations.webhooks.models import Body, Delivery, DeliveryState, Scope, Webhook
from slotserve_base import dispatch
from slotserve_base.audit import audited
from slotserve_base.errors import InvalidInput, TooManyTries
from slotserve_base.happenings import Happening, user_ref
from slotserve_base.vocabulary import WebhookEvent

# A user's webhooks at most (staff's too): each event is a delivery per webhook.
MOST_WEBHOOKS = 20
# Left out of a change: stays as it was.
UNCHANGED: Any = object()
# Tests and redeliveries a webhook may be sent in a minute: each is a try on the webhooks'
# worker, and a person checking their receiver needs a few, not a flood.
TRIES_PER_MINUTE = 5


def new_secret() -> str:
    """``whsec_`` and 24 random bytes in base64, as Standard Webhooks' libraries read it."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def _checked_url(url: str) -> str:
    url = url.strip()
    if len(url) > 2000:
        raise InvalidInput("url", "at most 2000 characters")
    try:
        addresses_of(*check_url(url))
    except Unresolved:
        pass  # a name this machine cannot resolve now: each delivery checks it again
    except Refused as exc:
        raise InvalidInput("url", str(exc)) from None
    return url


def _checked_events(events: Iterable[str]) -> list[str]:
    chosen = list(dict.fromkeys(events))
    unknown = [e for e in chosen if e not in WebhookEvent.values]
    if unknown:
        raise InvalidInput("events", f"unknown event {unknown[0]!r}; known: {', '.join(WebhookEvent.values)}")
    return chosen


def _checked_scope(owner: User, scope: str, channels: list[Channel]) -> str:
    if scope not in Scope.values:
        raise InvalidInput("scope", f"{scope!r} is not one of {', '.join(Scope.values)}")
    if scope == Scope.ALL and not owner.is_staff:
        raise InvalidInput("scope", "only staff may hear of everyone's events")
    if channels and scope != Scope.ALL:
        raise InvalidInput("channels", "channels choose among everyone's events: set scope to all")
    return scope


def _checked_body(body: str) -> str:
    if body not in Body.values:
        raise InvalidInput("body", f"{body!r} is not one of {', '.join(Body.values)}")
    return body


def webhook_create(
    *,
    owner: User,
    url: str,
    events: Iterable[str] = (),
    scope: str = Scope.MINE,
    channels: Iterable[Channel] = (),
    body: str = Body.STANDARD,
    name: str = "",
) -> Webhook:
    """A new webhook of ``owner``'s, with a new secret."""
    chosen = list(channels)
    with transaction.atomic():
        if Webhook.objects.select_for_update().filter(owner=owner).count() >= MOST_WEBHOOKS:
            raise InvalidInput("url", f"you have {MOST_WEBHOOKS} webhooks already, the most one may have")
        webhook = Webhook.objects.create(
            owner=owner,
            name=name.strip()[:100],
            url=_checked_url(url),
            secret=new_secret(),
            events=_checked_events(events),
            scope=_checked_scope(owner, scope, chosen),
            body=_checked_body(body),
        )
        webhook.channels.set(chosen)
    return webhook


def webhook_change(
    *,
    webhook: Webhook,
    url: str | None = None,
    events: Iterable[str] | None = None,
    scope: str | None = None,
    channels: Iterable[Channel] | None = None,
    body: str | None = None,
    name: str | None = None,
) -> Webhook:
    """Change what was given; the rest stays."""
    with transaction.atomic():
        chosen = list(channels) if channels is not None else list(webhook.channels.all())
        if url is not None:
            webhook.url = _checked_url(url)
        if events is not None:
            webhook.events = _checked_events(events)
        webhook.scope = _checked_scope(webhook.owner, scope or webhook.scope, chosen)
        if body is not None:
            webhook.body = _checked_body(body)
        if name is not None:
            webhook.name = name.strip()[:100]
        webhook.save(update_fields=["url", "events", "scope", "body", "name"])
        if channels is not None:
            webhook.channels.set(chosen)
    return webhook


def webhook_new_secret(*, webhook: Webhook) -> Webhook:
    """A new secret; deliveries from now on are signed with it."""
    webhook.secret = new_secret()
    webhook.save(update_fields=["secret"])
    return webhook


def webhook_pause(*, webhook: Webhook, now: datetime) -> Webhook:
    if Webhook.objects.filter(pk=webhook.pk, paused_at__isnull=True).update(
        paused_at=now, paused_reason="paused by its owner"
    ):
        audited(webhook, {"paused_at": None}, {"paused_at": now})
    webhook.refresh_from_db()
    return webhook


def webhook_resume(*, webhook: Webhook, now: datetime) -> Webhook:
    """Send again: the deliveries that waited go now, oldest first."""
    with transaction.atomic():
        audited(webhook, {"paused_at": webhook.paused_at}, {"paused_at": None})
        Webhook.objects.filter(pk=webhook.pk).update(paused_at=None, paused_reason="", lease_until=None)
        Delivery.objects.filter(webhook=webhook, state=DeliveryState.PENDING).update(next_try_at=now)
        transaction.on_commit(lambda: dispatch.send_quietly(dispatch.WEBHOOK_DELIVER, args=(webhook.pk,)))
    webhook.refresh_from_db()
    return webhook


def webhook_delete(*, webhook: Webhook) -> None:
    webhook.delete()


def _within_allowance(webhook: Webhook, now: datetime) -> None:
    """Refuse a test or redelivery past ``TRIES_PER_MINUTE`` for this webhook. The webhook's row
    is locked for the count, so two at once cannot both take the last one."""
    Webhook.objects.select_for_update().filter(pk=webhook.pk).first()
    since = now - timedelta(minutes=1)
    recent = list(
        Delivery.objects.filter(webhook=webhook, created__gt=since)
        .filter(Q(event__type=WebhookEvent.TEST) | Q(redelivery_of__isnull=False))
        .order_by("created")
        .values_list("created", flat=True)[:TRIES_PER_MINUTE]
    )
    if len(recent) >= TRIES_PER_MINUTE:
        wait = max(1, math.ceil((recent[0] + timedelta(minutes=1) - now).total_seconds()))
        raise TooManyTries(
            f"this webhook was sent {TRIES_PER_MINUTE} tests and redeliveries in the last minute, the most "
            f"it may be ({TRIES_PER_MINUTE} tests and redeliveries a minute); try again in {wait} s",
            retry_after=wait,
        )


def webhook_test(*, webhook: Webhook, by: User, now: datetime) -> Delivery:
    """Send a ``webhook.test`` event to this webhook alone, even while it is paused (to see that
    its receiver answers again)."""
    happening = Happening(
        type=WebhookEvent.TEST,
        at=now,
        data={"webhook": {"id": webhook.pk, "name": str(webhook)}, "by": user_ref(by)},
        subject=f"webhook:{webhook.pk}",
        words=f"A test event from SlotServe for the webhook {webhook}, sent by {by}.",
        link="/webhooks/",
    )
    with transaction.atomic():
        _within_allowance(webhook, now)
        event = store(happening, [webhook])
        assert event is not None
        delivery = Delivery.objects.get(event=event, webhook=webhook)
        transaction.on_commit(lambda: dispatch.send_quietly(dispatch.WEBHOOK_TEST_SEND, args=(delivery.pk,)))
    return delivery


def delivery_redeliver(*, delivery: Delivery, now: datetime) -> Delivery:
    """Send the same event again (the same ``webhook-id``: a receiver that has it knows it), as a
    new delivery with a log of its own."""
    with transaction.atomic():
        _within_allowance(delivery.webhook, now)
        again = Delivery.objects.create(
            webhook=delivery.webhook,
            event=delivery.event,
            body=delivery.body,
            next_try_at=now,
            redelivery_of=delivery,
        )
        if delivery.event.type == WebhookEvent.TEST:  # tried once, paused or not, as when first sent
            transaction.on_commit(lambda: dispatch.send_quietly(dispatch.WEBHOOK_TEST_SEND, args=(again.pk,)))
        else:
            transaction.on_commit(
                lambda: dispatch.send_quietly(dispatch.WEBHOOK_DELIVER, args=(delivery.webhook_id,))
            )
    return again
