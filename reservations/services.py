"""Booking, approving, rejecting, cancelling and ending reservations (SPEC §5).

Every state change is a conditional ``UPDATE … WHERE status = …``: zero rows
means someone else changed the reservation first, and the caller is told
which state it is in now. Every change that can alter what a channel runs
re-decides that channel right after it commits.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, OperationalError, connection, transaction

from channels_app.dispatch import enqueue_redecide
from channels_app.errors import InvalidInput
from channels_app.models import ApprovalPolicy, Channel, LLMModel, Preset
from channels_app.target import validate_target
from channels_app.vocabulary import NotificationEvent
from reservations.models import BLOCKING_STATUSES, Reservation, ReservationStatus
from reservations.notifications import notify
from reservations.rules import BookingLimits, check_length_and_horizon, check_quota, week_of

# A booking may start this little in the past: a form sent "now" arrives late.
START_GRACE = timedelta(minutes=1)
EXCLUSION_VIOLATION = "23P01"  # PostgreSQL's SQLSTATE for an exclusion constraint
DEADLOCK_DETECTED = "40P01"
DEADLOCK_RETRIES = 10

_T = TypeVar("_T")


def _retrying_deadlocks(work: Callable[[], _T]) -> _T:
    """Run ``work`` in a transaction, again if PostgreSQL chose it as a deadlock's victim.

    Two inserts that overlap each other's uncommitted rows would wait for each
    other while checking the exclusion constraint, and PostgreSQL would abort
    one; the channel's row lock (``_hold_channel``) keeps that from happening,
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


def _is_overlap(exc: IntegrityError) -> bool:
    """The database refused an overlap: PostgreSQL's exclusion constraint, or SQLite's trigger."""
    return getattr(exc.__cause__, "sqlstate", None) == EXCLUSION_VIOLATION or "reservation_no_overlap" in str(
        exc
    )


def _hold_channel(channel_id: int) -> None:
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
            message = (
                f"the slot overlaps reservation {conflicting.pk} of this channel "
                f"({_iso(conflicting.start)} to {_iso(conflicting.end)}, {conflicting.status})"
            )
        super().__init__(message)
        self.message = message


class InvalidTransition(Exception):
    """The reservation is not in a state that allows the requested change."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def needs_approval(*, channel: Channel, exclusive: bool, user: Any, by: Any = None) -> bool:
    """Whether a booking by ``user`` (made by ``by``, if someone else) waits for approval (SPEC §5)."""
    if user.is_staff or (by is not None and by.is_staff):
        return False
    if channel.approval_policy == ApprovalPolicy.ALL:
        return True
    return channel.approval_policy == ApprovalPolicy.EXCLUSIVE_ONLY and exclusive


def _first_conflict(
    channel: Channel, start: datetime, end: datetime, exclude: int | None = None
) -> Reservation | None:
    found = Reservation.objects.blocking().filter(channel=channel).overlapping(start, end)
    if exclude is not None:
        found = found.exclude(pk=exclude)
    return found.order_by("start").first()


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


def held_slots(
    *,
    user: Any,
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


def _whole_booking(reservation: Reservation) -> list[Reservation]:
    """The reservation and the ones it extends, oldest first: one booking for the limits."""
    chain = [reservation]
    while chain[0].extends_id is not None and len(chain) < 100:
        parent = chain[0].extends
        if parent is None or parent.status not in BLOCKING_STATUSES or parent.end != chain[0].start:
            break
        chain.insert(0, parent)
    return chain


def _check_limits(
    *,
    user: Any,
    channel: Channel,
    start: datetime,
    end: datetime,
    now: datetime,
    exclude: int | Collection[int] | None = None,
) -> None:
    limits = limits_of(channel)
    refusal = check_length_and_horizon(start=start, end=end, now=now, limits=limits)
    if refusal is None and not user.is_staff:
        held = held_slots(user=user, channel=channel, start=start, end=end, exclude=exclude)
        refusal = check_quota(start=start, end=end, held=held, quota_hours=limits.weekly_quota_hours)
    if refusal is not None:
        raise InvalidInput(refusal.field, refusal.message)


def validate_slot(
    *,
    channel: Channel,
    start: datetime,
    end: datetime,
    now: datetime,
    model: LLMModel | None,
    preset: Preset | None,
    exclusive: bool,
) -> None:
    if end <= start:
        raise InvalidInput("end", "end must be after start")
    if start < now - START_GRACE:
        raise InvalidInput("start", "start is in the past; reservations are for the future")
    if exclusive and (model is not None or preset is not None):
        raise InvalidInput("exclusive", "a whole-card reservation names no model or preset")
    if not exclusive and model is None:
        raise InvalidInput("model", "name a model (and preset), or book the whole card with exclusive: true")
    if exclusive and not channel.allow_whole_card:
        raise InvalidInput("exclusive", f"channel {channel.name} does not allow whole-card bookings")
    validate_target(model=model, preset=preset)


def reservation_create(
    *,
    user: Any,
    channel: Channel,
    start: datetime,
    end: datetime,
    now: datetime,
    model: LLMModel | None = None,
    preset: Preset | None = None,
    exclusive: bool = False,
    note: str = "",
    by: Any = None,
) -> Reservation:
    """Book ``[start, end)`` on ``channel`` for ``user`` (by ``by``, staff booking for
    someone, when given); raises ``ReservationConflict`` on overlap.

    The overlap check and the insert run one booking of the channel at a time:
    in one ``BEGIN IMMEDIATE`` transaction on SQLite, under the channel's row
    lock on PostgreSQL (``_hold_channel``). The exclusion constraint stands
    behind the check; should an insert still break it, the slot that won is
    reported.
    """
    # In UTC from here on: Python subtracts two times of one zone as wall-clock
    # times, which is wrong across a daylight-saving change.
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    validate_slot(
        channel=channel, start=start, end=end, now=now, model=model, preset=preset, exclusive=exclusive
    )
    pending = needs_approval(channel=channel, exclusive=exclusive, user=user, by=by)
    status = ReservationStatus.PENDING if pending else ReservationStatus.APPROVED

    def book() -> Reservation:
        # Inside the transaction: on SQLite it holds the write lock, so two
        # bookings of one user cannot both fit the same remaining quota.
        _hold_channel(channel.pk)
        _check_limits(user=user, channel=channel, start=start, end=end, now=now)
        conflict = _first_conflict(channel, start, end)
        if conflict is not None:
            raise ReservationConflict(conflict)
        try:
            with transaction.atomic():
                reservation = Reservation.objects.create(
                    user=user,
                    channel=channel,
                    start=start,
                    end=end,
                    model=None if exclusive else model,
                    preset=None if exclusive else preset,
                    exclusive=exclusive,
                    status=status,
                    note=note,
                    created=now,
                    decided_at=None if pending else now,
                    decided_by=None if pending or by is None else by,
                )
        except IntegrityError as exc:
            if not _is_overlap(exc):
                raise
            raise ReservationConflict(_first_conflict(channel, start, end)) from None
        if pending:
            _tell_approvers(reservation)
        else:
            enqueue_redecide(channel.pk)
        return reservation

    reservation = _retrying_deadlocks(book)
    return reservation


def reservation_create_anywhere(
    *,
    user: Any,
    start: datetime,
    end: datetime,
    now: datetime,
    model: LLMModel | None = None,
    preset: Preset | None = None,
    exclusive: bool = False,
    note: str = "",
    channel: None = None,
) -> Reservation:
    """Book the best channel that fits (SPEC §7): placement ranks them, and each is
    tried in turn with the same overlap guarantee as any booking, so two people asking
    at once end up on different channels or get a clear 409."""
    from channels_app.placement.api import placement_for

    if exclusive or model is None:
        raise InvalidInput(
            "channel", '"auto" needs a model to place; name a channel for a whole-card booking'
        )
    ranked = placement_for(model=model, preset=preset, start=start, end=end)
    for scored in ranked.ranked:
        chosen = Channel.objects.get(pk=scored.candidate.id)
        try:
            return reservation_create(
                user=user,
                channel=chosen,
                start=start,
                end=end,
                now=now,
                model=model,
                preset=preset,
                note=note,
            )
        except ReservationConflict:
            continue  # taken meanwhile: the next best
    raise NoChannelFits(ranked.message or "every channel that fits was booked meanwhile")


class NoChannelFits(ReservationConflict):
    """No channel can take the booking; the message says why for each."""

    def __init__(self, why: str) -> None:
        super().__init__(None)
        self.message = f"no channel can take this booking: {why}"


def reservation_extend(*, reservation: Reservation, by: Any, end: datetime, now: datetime) -> Reservation:
    """Move the end of an active or future reservation later, when that time is free.

    The added time is checked like a new booking of it (limits, quota, overlap).
    Where the channel's policy would make a booking of it wait for approval, an
    approved reservation keeps its approved part and gets a pending *extension*
    (a reservation of ``[end, new end)`` that ``extends`` it) and the approvers
    are told; otherwise, and for a pending reservation, the end itself moves.
    Returns the reservation that holds the new end.

    Races with a new booking of the same minutes are settled like bookings:
    one at a time per channel (the IMMEDIATE transaction on SQLite, the
    channel's row lock on PostgreSQL), with the database's rule behind.
    """
    if reservation.status not in BLOCKING_STATUSES or reservation.end <= now:
        raise InvalidTransition(f"cannot extend a reservation that is {reservation.status} or over")
    asking = reservation.extensions.filter(status=ReservationStatus.PENDING).order_by("-end").first()
    if asking is not None:
        # One request at a time: asking for more moves the end of the pending extension.
        return reservation_extend(reservation=asking, by=by, end=end, now=now)
    end = end.astimezone(UTC)
    if end <= reservation.end:
        raise InvalidInput("end", "the new end must be after the current end")
    as_request = reservation.status == ReservationStatus.APPROVED and needs_approval(
        channel=reservation.channel, exclusive=reservation.exclusive, user=reservation.user, by=by
    )

    booking = _whole_booking(reservation)

    def grow() -> Reservation:
        _hold_channel(reservation.channel_id)
        # The limits see the whole booking, the approved part and its extensions, as one.
        _check_limits(
            user=reservation.user,
            channel=reservation.channel,
            start=booking[0].start,
            end=end,
            now=min(now, booking[0].start),
            exclude=[part.pk for part in booking],
        )
        conflict = _first_conflict(reservation.channel, reservation.end, end, exclude=reservation.pk)
        if conflict is not None:
            raise ReservationConflict(conflict)
        try:
            with transaction.atomic():
                if as_request:
                    extension = Reservation.objects.create(
                        user=reservation.user,
                        channel=reservation.channel,
                        start=reservation.end,
                        end=end,
                        model=reservation.model,
                        preset=reservation.preset,
                        exclusive=reservation.exclusive,
                        status=ReservationStatus.PENDING,
                        note=reservation.note,
                        extends=reservation,
                        created=now,
                    )
                    _tell_approvers(extension)
                    return extension
                updated = Reservation.objects.filter(
                    pk=reservation.pk, status=reservation.status, end=reservation.end
                ).update(end=end)
        except IntegrityError as exc:
            if not _is_overlap(exc):
                raise
            raise ReservationConflict(
                _first_conflict(reservation.channel, reservation.end, end, exclude=reservation.pk)
            ) from None
        if not updated:
            raise InvalidTransition("the reservation changed meanwhile; reload it and try again")
        reservation.refresh_from_db()
        if reservation.status == ReservationStatus.APPROVED:
            enqueue_redecide(reservation.channel_id)
        return reservation

    return _retrying_deadlocks(grow)


def reservation_reschedule(
    *, reservation: Reservation, by: Any, start: datetime, end: datetime, note: str, now: datetime
) -> Reservation:
    """Staff move a pending or approved reservation to ``[start, end)`` (the Django admin).

    Checked like a booking of the new slot (limits, overlap, the database's rule
    behind); the owner is told, and the channel re-decides.
    """
    if reservation.status not in BLOCKING_STATUSES:
        raise InvalidTransition(f"cannot change a reservation that is {reservation.status}")
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    moved = (start, end) != (reservation.start, reservation.end)
    if moved:
        if end <= start:
            raise InvalidInput("end", "end must be after start")
        if reservation.end <= now:
            raise InvalidTransition("cannot move a reservation that is over")
        if start != reservation.start and start < now - START_GRACE:
            raise InvalidInput("start", "start is in the past; reservations are for the future")

    def change() -> Reservation:
        _hold_channel(reservation.channel_id)
        if moved:
            _check_limits(
                user=reservation.user,
                channel=reservation.channel,
                start=start,
                end=end,
                now=min(now, start),
                exclude=reservation.pk,
            )
            conflict = _first_conflict(reservation.channel, start, end, exclude=reservation.pk)
            if conflict is not None:
                raise ReservationConflict(conflict)
        try:
            with transaction.atomic():
                updated = Reservation.objects.filter(
                    pk=reservation.pk, status=reservation.status, start=reservation.start, end=reservation.end
                ).update(start=start, end=end, note=note)
        except IntegrityError as exc:
            if not _is_overlap(exc):
                raise
            raise ReservationConflict(
                _first_conflict(reservation.channel, start, end, exclude=reservation.pk)
            ) from None
        if not updated:
            raise InvalidTransition("the reservation changed meanwhile; reload it and try again")
        reservation.refresh_from_db()
        if moved:
            if by != reservation.user:
                notify(
                    user=reservation.user,
                    event=NotificationEvent.CHANGED,
                    text=f"Your reservation of {reservation.channel} was moved by {by} to "
                    f"{_iso(start)} – {_iso(end)}.",
                    key=f"changed:{reservation.pk}:{_iso(start)}:{_iso(end)}",
                )
            if reservation.status == ReservationStatus.APPROVED:
                enqueue_redecide(reservation.channel_id)
        return reservation

    return _retrying_deadlocks(change)


def _tell_approvers(reservation: Reservation) -> None:
    staff = get_user_model().objects.filter(is_staff=True, is_active=True)
    if reservation.extends_id is not None:
        text = (
            f"{reservation.user} asks to extend reservation {reservation.extends_id} of "
            f"{reservation.channel} until {_iso(reservation.end)} (the added time: "
            f"{_iso(reservation.start)} to {_iso(reservation.end)})."
        )
    else:
        text = (
            f"{reservation.user} asks for {reservation.channel} "
            f"from {_iso(reservation.start)} to {_iso(reservation.end)}."
        )
    for approver in staff:
        notify(
            user=approver,
            event=NotificationEvent.SUBMITTED,
            text=text,
            link="/approvals/",
            key=f"submitted:{reservation.pk}",
        )


def _transition(
    reservation: Reservation, allowed_from: tuple[str, ...], verb: str, **changes: Any
) -> Reservation:
    updated = Reservation.objects.filter(pk=reservation.pk, status__in=allowed_from).update(**changes)
    reservation.refresh_from_db()
    if not updated:
        raise InvalidTransition(f"cannot {verb} a reservation that is {reservation.status}")
    return reservation


def reservation_approve(*, reservation: Reservation, by: Any, now: datetime) -> Reservation:
    if reservation.end <= now:
        raise InvalidTransition("cannot approve a reservation whose slot is over")
    with transaction.atomic():
        _transition(
            reservation,
            (ReservationStatus.PENDING,),
            "approve",
            status=ReservationStatus.APPROVED,
            decided_by=by,
            decided_at=now,
        )
        notify(
            user=reservation.user,
            event=NotificationEvent.APPROVED,
            text=f"Your reservation of {reservation.channel} from {_iso(reservation.start)} is approved.",
            key=f"approved:{reservation.pk}",
        )
        enqueue_redecide(reservation.channel_id)
    return reservation


def reservation_reject(*, reservation: Reservation, by: Any, reason: str, now: datetime) -> Reservation:
    if not reason.strip():
        raise InvalidInput("reason", "say why the reservation is rejected")
    with transaction.atomic():
        _transition(
            reservation,
            (ReservationStatus.PENDING,),
            "reject",
            status=ReservationStatus.REJECTED,
            reject_reason=reason.strip(),
            decided_by=by,
            decided_at=now,
        )
        notify(
            user=reservation.user,
            event=NotificationEvent.REJECTED,
            text=f"Your reservation of {reservation.channel} from {_iso(reservation.start)} "
            f"was rejected: {reservation.reject_reason}",
            key=f"rejected:{reservation.pk}",
        )
    return reservation


def reservation_cancel(*, reservation: Reservation, by: Any, now: datetime) -> Reservation:
    """Cancel a pending reservation, or an approved one that has not started."""
    if reservation.status == ReservationStatus.APPROVED and reservation.start <= now:
        raise InvalidTransition(
            "cannot cancel a reservation that has started; end it early instead"
            if reservation.end > now
            else "cannot cancel a reservation that is over"
        )
    with transaction.atomic():
        was = reservation.status
        _transition(
            reservation,
            (ReservationStatus.PENDING, ReservationStatus.APPROVED),
            "cancel",
            status=ReservationStatus.CANCELLED,
        )
        if by != reservation.user:
            notify(
                user=reservation.user,
                event=NotificationEvent.CANCELLED,
                text=f"Your reservation of {reservation.channel} from {_iso(reservation.start)} "
                f"was cancelled by {by}.",
                key=f"cancelled:{reservation.pk}",
            )
        if was == ReservationStatus.APPROVED:
            enqueue_redecide(reservation.channel_id)
    return reservation


def reservation_end(*, reservation: Reservation, by: Any, now: datetime) -> Reservation:
    """End an active reservation now; the channel re-decides at once (SPEC §5)."""
    if not reservation.is_active(now):
        raise InvalidTransition(
            f"cannot end a reservation that is not active (it is {reservation.status}, "
            f"from {_iso(reservation.start)} to {_iso(reservation.end)})"
        )
    with transaction.atomic():
        # ``end`` must stay after ``start``: ending in the very first instant is a cancel.
        if now > reservation.start:
            changes: dict[str, Any] = {"status": ReservationStatus.ENDED, "end": now}
        else:
            changes = {"status": ReservationStatus.CANCELLED}
        _transition(reservation, (ReservationStatus.APPROVED,), "end", **changes)
        if by != reservation.user:
            notify(
                user=reservation.user,
                event=NotificationEvent.ENDED_EARLY,
                text=f"Your reservation of {reservation.channel} was ended early by {by}.",
                key=f"ended:{reservation.pk}",
            )
        enqueue_redecide(reservation.channel_id)
    return reservation
