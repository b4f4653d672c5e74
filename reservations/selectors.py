"""Reads of reservations that the services and the hints share (docs/architecture.md: reads
live in selectors)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.db.models import QuerySet

from channels_app.models import Channel
from channels_app.models.channel import channels_bookable_by
from reservations.models import Reservation
from reservations.rules import week_of


def first_conflict(
    channel: Channel, start: datetime, end: datetime, exclude: int | None = None
) -> Reservation | None:
    found = Reservation.objects.blocking().filter(channel=channel).overlapping(start, end)
    if exclude is not None:
        found = found.exclude(pk=exclude)
    return found.order_by("start").first()


def group_held_slots(
    *,
    group_id: int,
    channel: Channel,
    start: datetime,
    end: datetime,
    exclude: int | Collection[int] | None = None,
) -> list[tuple[datetime, datetime]]:
    """The pending and approved slots of all the group's members on ``channel`` in the quota
    weeks of ``[start, end)``."""
    weeks_from, weeks_to = week_of(start), week_of(end) + timedelta(days=7)
    found = (
        Reservation.objects.blocking()
        .filter(user__groups__id=group_id, channel=channel)
        .overlapping(weeks_from, weeks_to)
        .distinct()
    )
    if exclude is not None:
        found = found.exclude(pk__in=[exclude] if isinstance(exclude, int) else exclude)
    return list(found.values_list("start", "end"))


def reviewable_by(user: User) -> QuerySet[Reservation]:
    """Reservations ``user`` may approve or reject: all for staff; a group approver's, those of
    the group's members."""
    if user.is_staff:
        return Reservation.objects.all()
    # Never one's own: an approver who is a member asks like everyone else.
    return Reservation.objects.filter(user__groups__policy__approvers=user).exclude(user=user).distinct()


def held_slots(
    *,
    user: User,
    channel: Channel,
    start: datetime,
    end: datetime,
    exclude: int | Collection[int] | None = None,
) -> list[tuple[datetime, datetime]]:
    """The user's pending and approved slots on ``channel`` in the quota weeks of ``[start, end)``."""
    weeks_from, weeks_to = week_of(start), week_of(end) + timedelta(days=7)
    found = (
        Reservation.objects.blocking().filter(user=user, channel=channel).overlapping(weeks_from, weeks_to)
    )
    if exclude is not None:
        found = found.exclude(pk__in=[exclude] if isinstance(exclude, int) else exclude)
    return list(found.values_list("start", "end"))


def bookable_by(user: User) -> QuerySet[Channel]:
    """The channels ``user`` may book: staff every one; others those kept for no group, or for a
    group of theirs (the rule ``reservation_create`` enforces, docs/portal.md, "Groups")."""
    return channels_bookable_by(user)
