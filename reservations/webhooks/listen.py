"""Happenings become deliveries: each one is kept as an ``Event`` and, for every webhook that
hears of it, a ``Delivery`` with the body it will send, in the transaction that made it
(``slotserve_base.happenings``); the deliveries leave after the commit (``delivery``)."""

from __future__ import annotations

import functools
import json
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.dispatch import receiver
from django.utils import timezone

from reservations.webhooks.models import Body, Delivery, Event, Scope, Webhook
from reservations.wording import zone_of
from slotserve_base import dispatch
from slotserve_base.happenings import Happening, happened
from slotserve_base.iso import iso_moment
from slotserve_base.public_url import public_url

log = logging.getLogger(__name__)


def new_msg_id() -> str:
    """``msg_`` and a time-ordered, unguessable id: the ``webhook-id`` of an event's deliveries."""
    return f"msg_{time.time_ns() // 1_000_000:012x}{secrets.token_hex(8)}"


class Listener(NamedTuple):
    """What decides whether a webhook hears of an event (one row, no model to build)."""

    pk: int
    events: list[str]
    scope: str
    owner_id: int
    owner_is_staff: bool
    owner_is_active: bool


def hears(listener: Listener, happening: Happening, channels: Callable[[], set[int]]) -> bool:
    """Whether a webhook hears of ``happening``: an event it asked for, about its owner's own
    bookings and keys, or, for a staff owner's webhook of everyone's events, of its channels
    (``channels``: the ones it chose, asked only when they matter)."""
    if listener.events and happening.type not in listener.events:
        return False
    if not listener.owner_is_active:
        return False
    if listener.owner_id in happening.users:
        return True
    if listener.scope != Scope.ALL or not listener.owner_is_staff:
        return False
    chosen = channels()
    return not chosen or bool(chosen & happening.channels)


def payload(event: Event, link: str) -> dict[str, Any]:
    """The Standard Webhooks body: ``type``, ``timestamp`` and ``data`` (the objects, the link)."""
    return {
        "type": event.type,
        "timestamp": iso_moment(event.at),
        "data": {**event.data, "link": link},
    }


def standard_body(event: Event, happening: Happening) -> str:
    link = public_url(happening.link) or happening.link
    return json.dumps(payload(event, link), separators=(",", ":"))


def slack_escaped(text: str) -> str:
    """``&``, ``<`` and ``>`` as Slack says to escape them in a message's text: the names and
    reasons people type (a key named ``<!here>``) stay text, never a mention or a link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(webhook: Webhook, happening: Happening) -> str:
    """``{"text": …}``: the happening in words, in the webhook owner's time zone, with its link.
    SlotServe's words carry no markup of their own, so the whole text is escaped."""
    words = happening.words
    text = words(zone_of(webhook.owner)) if callable(words) else words
    whole = public_url(happening.link)
    return json.dumps({"text": slack_escaped(f"{text} {whole}" if whole else text)})


def listening(happening: Happening) -> list[Webhook]:
    """The webhooks that hear of ``happening``."""
    rows = [
        Listener(*row)
        for row in Webhook.objects.values_list(
            "pk", "events", "scope", "owner_id", "owner__is_staff", "owner__is_active"
        )
    ]
    if not rows:
        return []
    chosen: dict[int, set[int]] = {}
    if any(r.scope == Scope.ALL for r in rows):
        through = Webhook.channels.through.objects.filter(webhook_id__in=[r.pk for r in rows])
        for webhook_id, channel_id in through.values_list("webhook_id", "channel_id"):
            chosen.setdefault(webhook_id, set()).add(channel_id)
    none: set[int] = set()

    def channels_of(pk: int) -> Callable[[], set[int]]:
        return lambda: chosen.get(pk, none)

    hearing = [r.pk for r in rows if hears(r, happening, channels_of(r.pk))]
    return list(Webhook.objects.filter(pk__in=hearing).select_related("owner")) if hearing else []


def store(happening: Happening, webhooks: Iterable[Webhook] | None = None) -> Event | None:
    """Keep ``happening`` and its deliveries; None when its key was told before, or when no
    webhook hears of it and it has no key (nothing is kept). ``webhooks``: only these (a test
    event), else every webhook that hears of it."""
    with transaction.atomic():
        return _store(happening, webhooks)


def _store(happening: Happening, webhooks: Iterable[Webhook] | None) -> Event | None:
    chosen = listening(happening) if webhooks is None else list(webhooks)
    if not chosen and happening.key is None:
        return None  # nobody hears of it, and nothing asks whether it was told
    try:
        with transaction.atomic():
            event = Event.objects.create(
                msg_id=new_msg_id(),
                type=happening.type,
                at=happening.at,
                data=dict(happening.data),
                subject=happening.subject,
                key=happening.key,
            )
    except IntegrityError:
        if happening.key is not None and Event.objects.filter(key=happening.key).exists():
            return None
        raise
    # Due now, whenever the happening was (a job may tell of a slot that began a minute ago).
    due = timezone.now()
    standard = standard_body(event, happening) if any(w.body == Body.STANDARD for w in chosen) else ""
    Delivery.objects.bulk_create(
        Delivery(
            webhook=webhook,
            event=event,
            body=slack_body(webhook, happening) if webhook.body == Body.SLACK else standard,
            next_try_at=due,
        )
        for webhook in chosen
    )
    for webhook in chosen:
        if webhook.paused_at is None:
            transaction.on_commit(functools.partial(_deliver, webhook.pk))
    return event


def _deliver(webhook_id: int) -> None:
    dispatch.send_quietly(dispatch.WEBHOOK_DELIVER, args=(webhook_id,))


@receiver(happened, sender=Happening, dispatch_uid="reservations.webhooks.listen.on_happening")
def on_happening(sender: type[Happening], happening: Happening, **_: Any) -> None:
    # Whatever made the happening stands even when its announcement cannot be kept: a booking
    # approved stays approved, a channel's reconcile goes on. Not when the connection went with
    # it (the database restarted): then the caller's transaction cannot commit, and it must fail
    # as a whole, or its caller would report as done what was rolled back.
    try:
        store(happening)
    except DatabaseError:
        if connection.in_atomic_block and connection.needs_rollback:
            raise
        log.exception("webhooks: could not keep the event %s (%s)", happening.type, happening.subject)
