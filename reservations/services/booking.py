"""Booking a slot: on a named channel, or on the best channel that fits (docs/scheduling.md, "Placement")."""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from channels_app.models import Channel, LLMModel, Preset
from reservations.models import Reservation
from reservations.selectors import first_conflict
from reservations.services.common import (
    ReservationConflict,
    check_limits,
    hold_channel,
    is_overlap,
    needs_approval,
    new_reservation,
    retrying_deadlocks,
    tell_approvers,
    validate_slot,
)
from slotserve_base.errors import InvalidInput


def reservation_create(
    *,
    user: User,
    channel: Channel,
    start: datetime,
    end: datetime,
    now: datetime,
    model: LLMModel | None = None,
    preset: Preset | None = None,
    exclusive: bool = False,
    note: str = "",
    by: User | None = None,
    lend: bool = False,
) -> Reservation:
    """Book ``[start, end)`` on ``channel`` for ``user`` (by ``by``, staff booking for
    someone, when given); raises ``ReservationConflict`` on overlap.

    The overlap check and the insert run one booking of the channel at a time:
    in one ``BEGIN IMMEDIATE`` transaction on SQLite, under the channel's row
    lock on PostgreSQL (``hold_channel``). The exclusion constraint stands
    behind the check; should an insert still break it, the slot that won is
    reported.
    """
    # In UTC from here on: Python subtracts two times of one zone as wall-clock
    # times, which is wrong across a daylight-saving change.
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    validate_slot(
        channel=channel,
        start=start,
        end=end,
        now=now,
        model=model,
        preset=preset,
        exclusive=exclusive,
        lend=lend,
    )
    pending = needs_approval(channel=channel, exclusive=exclusive, user=user, by=by)

    def book() -> Reservation:
        # Inside the transaction: on SQLite it holds the write lock, so two
        # bookings of one user cannot both fit the same remaining quota.
        hold_channel(channel.pk)
        check_limits(user=user, channel=channel, start=start, end=end, now=now)
        conflict = first_conflict(channel, start, end)
        if conflict is not None:
            raise ReservationConflict(conflict)
        try:
            with transaction.atomic():
                reservation = new_reservation(
                    user=user,
                    channel=channel,
                    start=start,
                    end=end,
                    model=model,
                    preset=preset,
                    exclusive=exclusive,
                    note=note,
                    pending=pending,
                    now=now,
                    by=by,
                    lend=lend,
                )
        except IntegrityError as exc:
            if not is_overlap(exc):
                raise
            raise ReservationConflict(first_conflict(channel, start, end)) from None
        if pending:
            tell_approvers(reservation)
        return reservation

    reservation = retrying_deadlocks(book)
    return reservation


def reservation_create_anywhere(
    *,
    user: User,
    start: datetime,
    end: datetime,
    now: datetime,
    model: LLMModel | None = None,
    preset: Preset | None = None,
    exclusive: bool = False,
    note: str = "",
    channel: None = None,
    lend: bool = False,
) -> Reservation:
    """Book the best channel that fits (docs/scheduling.md): placement ranks them, and each is
    tried in turn with the same overlap guarantee as any booking, so two people asking
    at once end up on different channels or get a clear 409."""
    from channels_app.placement.selectors import placement_for

    if exclusive or model is None:
        raise InvalidInput(
            "channel", '"auto" needs a model to place; name a channel for a whole-card booking'
        )
    ranked = placement_for(model=model, preset=preset, start=start, end=end)
    closed: list[str] = []  # channels that fit but are for groups the user is not in
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
                lend=lend and chosen.lend_while_idle,
            )
        except ReservationConflict:
            continue  # taken meanwhile: the next best
        except InvalidInput as refused:
            if refused.field != "channel":
                raise
            closed.append(chosen.name)  # limited to other groups: the next best
    if closed and len(closed) == len(ranked.ranked):
        raise NoChannelFits(f"the channels that fit ({', '.join(closed)}) are for groups you are not in")
    raise NoChannelFits(ranked.message or "every channel that fits was booked meanwhile")


class NoChannelFits(ReservationConflict):
    """No channel can take the booking; the message says why for each."""

    def __init__(self, why: str) -> None:
        super().__init__(None)
        self.message = f"no channel can take this booking: {why}"
