"""What the booking services share: the database's rules, limits and refusals."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection
from datetime import datetime, timedelta, tzinfo
from typing import TypeVar

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import IntegrityError, OperationalError, connection, transaction

from channels_app.models import ApprovalPolicy, Channel, validate_target
from reservations.announce import announce_booking
from reservations.models import BLOCKING_STATUSES, Reservation, ReservationSeries, ReservationStatus
from reservations.notifications import notify, slot_of
from reservations.rules import (
    BookingLimits,
    Closure,
    LimitBroken,
    check_length_and_horizon,
    check_quota,
    closure_over,
)
from reservations.selectors import closures_over, group_held_slots, held_slots, reviewable_by
from reservations.services.asked import NewBooking
from reservations.wording import moment_words, slot_words
from slotserve_base import overview
from slotserve_base.errors import InvalidInput
from slotserve_base.vocabulary import NotificationEvent, WebhookEvent

# A booking may start this little in the past: a form sent "now" arrives late.
START_GRACE = timedelta(minutes=1)
EXCLUSION_VIOLATION = "23P01"  # PostgreSQL's SQLSTATE for an exclusion constraint
DEADLOCK_DETECTED = "40P01"
DEADLOCK_RETRIES = 10

_T = TypeVar("_T")


def retrying_deadlocks(work: Callable[[], _T]) -> _T:
    """Run ``work`` in a transaction, again if PostgreSQL chose it as a deadlock's victim.

    Two inserts that overlap each other's uncommitted rows would wait for each
    other while checking the exclusion constraint, and PostgreSQL would abort
    one; the channel's row lock (``hold_channel``) keeps that from happening,
    and this stays as the net behind it: run again, the victim sees the
    winner's row and answers a clear conflict. Inside an
    outer transaction nothing can be retried, so the error goes up as it is.
    """
    for attempt in range(DEADLOCK_RETRIES):
        if connection.in_atomic_block:
            return work()
        try:
            with transaction.atomic():
                return work()
        except OperationalError as exc:
            if (
                getattr(exc.__cause__, "sqlstate", None) != DEADLOCK_DETECTED
                or attempt == DEADLOCK_RETRIES - 1
            ):
                raise
            # Back off a random while, growing, so the same contenders do not meet again.
            time.sleep(random.uniform(0.005, 0.03) * (attempt + 1))
    raise AssertionError("unreachable")


def is_overlap(exc: IntegrityError) -> bool:
    """The database refused an overlap: PostgreSQL's exclusion constraint, or SQLite's trigger."""
    return getattr(exc.__cause__, "sqlstate", None) == EXCLUSION_VIOLATION or "reservation_no_overlap" in str(
        exc
    )


def hold_channel(channel_id: int) -> None:
    """Take the channel's row lock for the rest of the transaction.

    Bookings and extensions of one channel then go one at a time on
    PostgreSQL, so their exclusion checks never wait on each other (SQLite's
    IMMEDIATE transaction already does this). ``NO KEY UPDATE`` leaves rows
    that merely point at the channel free to be written meanwhile.
    """
    list(Channel.objects.select_for_update(no_key=True).filter(pk=channel_id).values_list("pk", flat=True))


class ReservationConflict(Exception):
    """The slot overlaps a pending or approved reservation of the same channel."""

    def __init__(self, conflicting: Reservation | None) -> None:
        self.conflicting = conflicting
        if conflicting is None:
            message = "the slot overlaps another reservation of this channel"
        else:
            slot = slot_words(conflicting.start, conflicting.end)
            message = (
                f"the slot overlaps reservation {conflicting.pk} of this channel "
                f"({conflicting.user}'s, {slot}, {conflicting.status})"
            )
        super().__init__(message)
        self.message = message


class InvalidTransition(Exception):
    """The reservation is not in a state that allows the requested change."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def needs_approval(*, channel: Channel, exclusive: bool, user: User, by: User | None = None) -> bool:
    """Whether a booking by ``user`` (made by ``by``, if someone else) waits for approval
    (docs/scheduling.md)."""
    if user.is_staff or (by is not None and by.is_staff):
        return False
    if channel.approval_policy == ApprovalPolicy.ALL:
        return True
    return channel.approval_policy == ApprovalPolicy.EXCLUSIVE_ONLY and exclusive


def limits_of(channel: Channel) -> BookingLimits:
    """The channel's own limits; where it sets none, the installation's defaults
    (``SLOTSERVE_DEFAULT_MAX_BOOKING_HOURS``, ``SLOTSERVE_DEFAULT_MAX_DAYS_AHEAD``)."""
    default_max_minutes = round(settings.SLOTSERVE_DEFAULT_MAX_BOOKING_HOURS * 60)
    return BookingLimits(
        min_minutes=channel.min_booking_minutes,
        max_minutes=channel.max_booking_minutes or max(default_max_minutes, channel.min_booking_minutes),
        max_days_ahead=channel.max_days_ahead or settings.SLOTSERVE_DEFAULT_MAX_DAYS_AHEAD,
        weekly_quota_hours=channel.weekly_quota_hours,
    )


def whole_booking(reservation: Reservation) -> list[Reservation]:
    """The reservation and the ones it extends, oldest first: one booking for the limits."""
    chain = [reservation]
    while chain[0].extends_id is not None and len(chain) < 100:
        parent = chain[0].extends
        if parent is None or parent.status not in BLOCKING_STATUSES or parent.end != chain[0].start:
            break
        chain.insert(0, parent)
    return chain


def limit_problems(
    *,
    user: User,
    channel: Channel,
    start: datetime,
    end: datetime,
    now: datetime,
    exclude: int | Collection[int] | None = None,
    also_held: Collection[tuple[datetime, datetime]] = (),
) -> list[LimitBroken]:
    """The channel's limits the slot breaks: a blackout (for everyone), length, horizon, and (not
    for staff) the weekly quotas, the user's and their groups' (``also_held``: slots not saved yet
    that count too, a series' earlier occurrences)."""
    limits = limits_of(channel)
    problems = []
    closed = closure_over(start=start, end=end, closures=closures_over(channel.pk, start, end))
    if closed is not None:
        problems.append(LimitBroken("start", closed_words(channel.name, closed)))
    broken = check_length_and_horizon(start=start, end=end, now=now, limits=limits)
    if broken is not None:
        problems.append(broken)
    if not user.is_staff:
        held = held_slots(user=user, channel=channel, start=start, end=end, exclude=exclude)
        broken = check_quota(
            start=start, end=end, held=[*held, *also_held], quota_hours=limits.weekly_quota_hours
        )
        if broken is not None:
            problems.append(broken)
        problems += group_problems(
            user=user, channel=channel, start=start, end=end, exclude=exclude, also_held=also_held
        )
    return problems


def closed_words(channel: str, closed: Closure) -> str:
    """``channel gpu-a is closed Mon 7 Dec 09:00–11:00 UTC: firmware update``."""
    return f"channel {channel} is closed {slot_words(closed.start, closed.end)}: {closed.reason}"


def group_problems(
    *,
    user: User,
    channel: Channel,
    start: datetime,
    end: datetime,
    exclude: int | Collection[int] | None = None,
    also_held: Collection[tuple[datetime, datetime]] = (),
) -> list[LimitBroken]:
    """A channel limited to groups the user is not in; a group's weekly quota on the channel
    (its members' hours together, ``also_held`` added: a series' own earlier occurrences)."""
    if user.is_staff:
        return []
    allowed = {g.pk: g.name for g in channel.allowed_groups.all()}
    mine = {g.pk: g.name for g in user.groups.all()}
    if allowed and not set(allowed) & set(mine):
        names = ", ".join(sorted(allowed.values()))
        return [
            LimitBroken(
                "channel", f"channel {channel.name} is for the groups {names}; you are in none of them"
            )
        ]
    quota = channel.group_weekly_quota_hours
    if quota is None:
        return []
    for group_id, name in sorted(mine.items(), key=lambda item: item[1]):
        held = group_held_slots(group_id=group_id, channel=channel, start=start, end=end, exclude=exclude)
        broken = check_quota(
            start=start, end=end, held=[*held, *also_held], quota_hours=quota, whose=f"group {name}'s"
        )
        if broken is not None:
            return [broken]
    return []


def may_review(user: User, reservation: Reservation) -> bool:
    """Staff, or an approver of a group the booker is in."""
    return reviewable_by(user).filter(pk=reservation.pk).exists()


def check_limits(
    *,
    user: User,
    channel: Channel,
    start: datetime,
    end: datetime,
    now: datetime,
    exclude: int | Collection[int] | None = None,
) -> None:
    problems = limit_problems(user=user, channel=channel, start=start, end=end, now=now, exclude=exclude)
    if problems:
        raise InvalidInput(problems[0].field, problems[0].message)


def slot_problems(
    *, channel: Channel, start: datetime, end: datetime, now: datetime, exclusive: bool
) -> list[LimitBroken]:
    """What is wrong with the slot itself: its order, a start in the past, a whole card where the
    channel allows none."""
    problems = []
    if end <= start:
        problems.append(LimitBroken("end", "end must be after start"))
    if start < now - START_GRACE:
        problems.append(LimitBroken("start", "start is in the past; reservations are for the future"))
    if exclusive and not channel.allow_whole_card:
        problems.append(
            LimitBroken("exclusive", f"channel {channel.name} does not allow whole-card bookings")
        )
    return problems


def validate_slot(booking: NewBooking, *, now: datetime) -> None:
    """What the booking asks for is possible at all: its slot, a model or the whole card, a
    preset of that model, lending where the channel lends."""
    channel = booking.where
    exclusive, model, preset = booking.exclusive, booking.model, booking.preset
    problems = slot_problems(
        channel=channel, start=booking.start, end=booking.end, now=now, exclusive=exclusive
    )
    if problems:
        raise InvalidInput(problems[0].field, problems[0].message)
    if exclusive and (model is not None or preset is not None):
        raise InvalidInput("exclusive", "a whole-card reservation names no model or preset")
    if not exclusive and model is None:
        raise InvalidInput("model", "name a model (and preset), or book the whole card with exclusive: true")
    validate_target(model=model, preset=preset)
    if booking.lend:
        lend_problem(channel=channel, exclusive=exclusive)


def lend_problem(*, channel: Channel, exclusive: bool) -> None:
    """A booker may lend their idle time only on a channel that lends, and only a model
    (docs/gateway.md, "Lending")."""
    if exclusive:
        raise InvalidInput("lend", "a whole-card booking runs no model to lend")
    if not channel.lend_while_idle:
        raise InvalidInput(
            "lend", f"channel {channel.name} does not lend booked time (its staff choose whether it does)"
        )


def new_reservation(
    booking: NewBooking, *, pending: bool, now: datetime, series: ReservationSeries | None = None
) -> Reservation:
    """The insert every booking ends in (inside the caller's checks and transaction)."""
    exclusive = booking.exclusive
    reservation = Reservation.objects.create(
        user=booking.user,
        channel=booking.where,
        start=booking.start,
        end=booking.end,
        model=None if exclusive else booking.model,
        preset=None if exclusive else booking.preset,
        exclusive=exclusive,
        lend=booking.lend and not exclusive,
        status=ReservationStatus.PENDING if pending else ReservationStatus.APPROVED,
        note=booking.note,
        created=now,
        reviewed_at=None if pending else now,
        reviewed_by=None if pending or booking.by is None else booking.by,
        series=series,
    )
    announce_booking(WebhookEvent.BOOKING_REQUESTED, reservation, at=now)
    if not pending:
        announce_booking(WebhookEvent.BOOKING_APPROVED, reservation, at=now, said="approved at once")
    return reservation


def tell_approvers(reservation: Reservation, also: int = 0) -> None:
    """The approvers hear of a booking (or extension) that waits for them: the booker's groups'
    approvers, or staff where the groups name none. ``also``: how many more occurrences of the
    same series wait with it."""
    staff = get_user_model().objects.filter(is_staff=True, is_active=True)
    transaction.on_commit(lambda: overview.counts_changed(approvers=True))  # every approver's count

    def text(zone: tzinfo) -> str:
        if reservation.extends_id is not None:
            return (
                f"{reservation.user} asks to extend their booking of {reservation.channel} (now until "
                f"{moment_words(reservation.start, zone)}) until {moment_words(reservation.end, zone)} "
                f"(the added time: {slot_words(reservation.start, reservation.end, zone)})."
            )
        more = f" and {also} more occurrences of the series" if also else ""
        return (
            f"{reservation.user} asks for {reservation.channel}, "
            f"{slot_words(reservation.start, reservation.end, zone)}{more}."
        )

    approvers = set(group_approvers(reservation.user))
    if not approvers:
        approvers = set(staff)
    for approver in sorted(approvers, key=lambda u: u.pk):
        notify(
            user=approver,
            event=NotificationEvent.SUBMITTED,
            text=text,
            link=f"/approvals/#reservation-{reservation.pk}",
            key=f"submitted:{reservation.pk}",
            about=slot_of(reservation),
        )


def group_approvers(user: User) -> list[User]:
    """Who decides ``user``'s requests: their groups' approvers (never themselves), by name;
    empty: staff do."""
    return list(
        get_user_model()
        .objects.filter(approves_for__group__user=user, is_active=True)
        .exclude(pk=user.pk)
        .distinct()
        .order_by("username")
    )
