"""What follows from a booking's happening (docs/architecture.md, "What happened, told once"):
the services tell what happened to a booking once (``reservations.announce``); this listener
does what follows from it, in the same transaction, the same way whichever service told it.

- A booking approved, or an approved one changed, cancelled or ended: its channel re-decides
  right after the commit (``slotserve_base.dispatch.enqueue_redecide``; several in one
  transaction re-decide it once).
- A slot left (a request rejected, a booking cancelled, ended, released or moved): those waiting
  for the channel hear whether their slot is free now (``services.waitlist.tell_waiting``).
"""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from reservations.models import ReservationStatus
from reservations.services.waitlist import tell_waiting
from slotserve_base.dispatch import enqueue_redecide
from slotserve_base.happenings import Happening, happened
from slotserve_base.vocabulary import WebhookEvent

# The happenings after which a booking's slot may be free for others.
LEAVES_A_SLOT = frozenset(
    {
        WebhookEvent.BOOKING_REJECTED,
        WebhookEvent.BOOKING_CANCELLED,
        WebhookEvent.BOOKING_ENDED_EARLY,
        WebhookEvent.BOOKING_RELEASED_IDLE,
        WebhookEvent.BOOKING_CHANGED,
    }
)
# The happenings that may change what a channel should run, when the booking was or is approved.
MAY_REDECIDE = LEAVES_A_SLOT | {WebhookEvent.BOOKING_APPROVED}


@receiver(happened, sender=Happening, dispatch_uid="reservations.consequences.on_happening")
def on_happening(sender: type[Happening], happening: Happening, **_: Any) -> None:
    if happening.type not in MAY_REDECIDE:
        return
    booking = happening.data["booking"]
    channel_id = booking["channel"]["id"]
    approved = ReservationStatus.APPROVED
    if approved in (booking["status"], happening.data.get("was")):
        enqueue_redecide(channel_id)
    if happening.type in LEAVES_A_SLOT:
        tell_waiting(channel_id=channel_id, now=happening.at)
