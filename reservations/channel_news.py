"""The node worker's news of a channel, told to the people it concerns
(``channels_app.node_worker.news``): the booker of the reservation it is about, and the admins
of failures, fallbacks and recoveries, each in their own time zone."""

from __future__ import annotations

from datetime import tzinfo
from typing import Any

from django.contrib.auth import get_user_model
from django.dispatch import receiver

from channels_app.node_worker.news import News, channel_news
from reservations.models import Reservation
from reservations.notifications import notify
from reservations.wording import slot_words


@receiver(channel_news, sender=News, dispatch_uid="reservations.channel_news.tell")
def tell(sender: type[News], news: News, **_: Any) -> None:
    reservation = news.reservation

    def text(zone: tzinfo) -> str:
        return news.text if reservation is None else f"{news.text} {reservation_summary(reservation, zone)}"

    admins = get_user_model().objects.filter(is_staff=True, is_active=True) if news.for_admins else None
    if reservation is not None:
        notify(user=reservation.user, event=news.event, text=text, link="/", key=news.key)
        admins = admins.exclude(pk=reservation.user_id) if admins is not None else None
    for admin in admins if admins is not None else ():
        notify(user=admin, event=news.event, text=text, link="/", key=news.key)


def reservation_summary(reservation: Reservation, zone: tzinfo | None = None) -> str:
    slot = slot_words(reservation.start, reservation.end, zone)
    return f"({reservation.user}'s booking of {reservation.channel}, {slot})"
