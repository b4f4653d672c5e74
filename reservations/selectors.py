"""Reads of reservations that the services and the hints share (docs/architecture.md: reads
live in selectors)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.db.models import Q, QuerySet

from channels_app.models import Channel
from channels_app.models.channel import channels_bookable_by
from reservations.models import Blackout, Bulletin, Reservation
from reservations.rules import Closure, week_of


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


def blackouts_over(channel_id: int, start: datetime, end: datetime) -> QuerySet[Blackout]:
    """The blackouts that close ``channel_id`` at some time in ``[start, end)``: its own, and
    those that name no channel (every channel)."""
    return (
        Blackout.objects.filter(start__lt=end, end__gt=start)
        .filter(Q(channels=channel_id) | Q(channels__isnull=True))
        .distinct()
        .order_by("start")
    )


def closures_over(channel_id: int, start: datetime, end: datetime) -> list[Closure]:
    return [Closure(b.start, b.end, b.reason) for b in blackouts_over(channel_id, start, end)]


def blackouts_ahead(now: datetime, days: int = 7) -> QuerySet[Blackout]:
    """The blackouts under way or beginning within ``days``, with their channels."""
    return (
        Blackout.objects.filter(end__gt=now, start__lt=now + timedelta(days=days))
        .prefetch_related("channels")
        .order_by("start")
    )


def bulletins_shown(now: datetime) -> QuerySet[Bulletin]:
    """What staff post now, newest first."""
    return Bulletin.objects.filter(shown_from__lte=now).filter(
        Q(shown_until__isnull=True) | Q(shown_until__gt=now)
    )
