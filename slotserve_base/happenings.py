"""What happened, for whoever listens: the one way a stage tells the world outside of an event
(docs/webhooks.md).

A booking approved, a channel ready, a node gone quiet: each stage that knows sends a
``Happening`` with ``tell``. The stages do not know who listens (the webhooks,
``reservations.webhooks``), so the node worker and the gateway need import nothing of the
bookings to be heard. A happening sent inside a transaction is kept with it: the webhooks store
their deliveries in the same transaction, and a change rolled back announces nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Any

from django.db import DatabaseError, connection
from django.dispatch import Signal

# Words for people: fixed, or written for the reader's time zone.
Words = str | Callable[[tzinfo], str]


@dataclass(frozen=True)
class Happening:
    """One event.

    ``type``: a ``WebhookEvent``. ``data``: the objects' ids and names, as JSON-ready values.
    ``subject``: the object whose events keep their order (``reservation:12``, ``channel:3``).
    ``users``: whom it concerns as their own (a booker, a key's owner): their webhooks hear of it.
    ``channels``: the channels it is about, for staff webhooks limited to some channels.
    ``link``: the portal page it leads to (a path). ``key``: names it once; a second happening
    with the same key is not announced again.
    """

    type: str
    at: datetime
    data: Mapping[str, Any]
    subject: str
    words: Words
    users: frozenset[int] = frozenset()
    channels: frozenset[int] = frozenset()
    link: str = "/"
    key: str | None = None


# Sent with ``happening=Happening(...)``.
happened = Signal()


def tell(happening: Happening) -> None:
    """Announce ``happening`` to every listener (in this process, in the caller's transaction).

    A listener may fail quietly (the webhooks' event not kept), but not leave the caller's
    transaction marked for rollback: Django would roll it back at its end without a word, and
    the caller report as done what is not there. Then this raises instead."""
    happened.send(sender=Happening, happening=happening)
    if connection.in_atomic_block and connection.needs_rollback:
        raise DatabaseError(f"a listener of {happening.type} left its transaction unable to commit")


def user_ref(user: Any) -> dict[str, Any]:
    return {"id": user.pk, "username": user.get_username()}


def named(obj: Any) -> dict[str, Any] | None:
    """``{"id", "name"}`` of a channel, model, node or preset; None for None."""
    return None if obj is None else {"id": obj.pk, "name": obj.name}
