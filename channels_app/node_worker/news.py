"""What the node worker has to tell people: a booking's model ready, failed, fallen back to the
default, recovered.

The node worker knows what happened to a channel; who hears of it, in whose words and time zone,
is the reservations app's business, and the node worker does not import the bookings
(docs/architecture.md). It sends ``channel_news``; ``reservations.channel_news`` listens and
notifies the booker and, for failures and fallbacks, the admins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.dispatch import Signal

if TYPE_CHECKING:
    from channels_app.models import Channel
    from reservations.models import Reservation


@dataclass(frozen=True)
class News:
    """One piece of news about a channel. ``key`` names it once: a second send with the same key
    notifies nobody again (the failure episode's start is part of it)."""

    channel: Channel
    reservation: Reservation | None
    event: str  # a NotificationEvent
    text: str
    key: str
    for_admins: bool


# Sent with ``news=News(...)``.
channel_news = Signal()
