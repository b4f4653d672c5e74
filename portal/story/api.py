"""A channel's story (docs/scheduling.md, "A channel's story"), as the API answers it:
``GET /api/channels/{id}/story?from=&to=&booking=`` (the page, ``portal.story.page``, shows the same).

Members read the story of the channels they may book, with the requests counted but not whose;
staff read every channel's, with who sent the requests. ``booking`` centres the window on a
booking and says why its model was, or was not, ready at its start.
"""

from __future__ import annotations

from datetime import datetime, timedelta, tzinfo
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from channels_app.models import Channel
from portal.story import reads
from portal.story.telling import lines, verdict
from reservations.models import Reservation, ReservationStatus
from slotserve_base.api_fields import is_id, moment_param
from slotserve_base.iso import iso_moment

# The longest window one answer tells.
MAX_WINDOW = timedelta(days=7)
# A window without ``from``: the last hours.
RECENT = timedelta(hours=6)
# Around a booking: the preload before it, and what followed it.
BEFORE_BOOKING = timedelta(minutes=30)
AFTER_BOOKING = timedelta(minutes=10)


def channel_for(viewer: User, pk: int) -> Channel:
    channel = reads.channels_for(viewer).select_related("node").filter(pk=pk).first()
    if channel is None:
        raise NotFound("no channel with this id that you may use")
    return channel


# Others' bookings a member may read the verdict of: those the calendar shows everyone.
SHOWN_TO_ALL = [ReservationStatus.PENDING, ReservationStatus.APPROVED, ReservationStatus.ENDED]


def booking_on(channel: Channel, raw: str | None, viewer: User) -> Reservation | None:
    if raw in (None, ""):
        return None
    if not is_id(str(raw)):
        raise serializers.ValidationError({"booking": f"{raw!r} is not a booking id"})
    found = Reservation.objects.select_related("user").filter(pk=int(str(raw)), channel=channel).first()
    if (
        found is not None
        and not viewer.is_staff
        and found.user_id != viewer.pk
        and found.status not in SHOWN_TO_ALL
    ):
        found = None  # someone else's cancelled or rejected booking: not theirs to read, nor to know of
    if found is None:
        raise serializers.ValidationError({"booking": f"no booking {raw} on the channel {channel.name}"})
    return found


def story(
    *,
    channel: Channel,
    viewer: User,
    start: datetime,
    end: datetime,
    booking: Reservation | None,
    now: datetime,
    tz: tzinfo,
) -> dict[str, Any]:
    """The story of ``channel`` from ``start`` to ``end``, as the API answers it."""
    if end <= start:
        raise serializers.ValidationError({"to": "to must be after from"})
    if end - start > MAX_WINDOW:
        raise serializers.ValidationError({"to": f"a story covers at most {MAX_WINDOW.days} days"})
    kept = reads.entries(channel, start, end)
    held = reads.bookings(channel, start, end)
    named = reads.names(held)
    told = lines(kept, held, named, start=start, end=end, now=now, tz=tz)
    answer: dict[str, Any] = {
        "channel": {"id": channel.pk, "name": channel.name, "node": channel.node.name},
        "from": iso_moment(start),
        "to": iso_moment(end),
        "lines": [
            {"at": iso_moment(line.at), "kind": line.kind, "words": line.words, "booking": line.booking_id}
            for line in told
        ],
        "requests": reads.requests(channel, start, end, everyone=viewer.is_staff),
        "booking": None,
    }
    for bucket in answer["requests"]["buckets"]:
        bucket["at"] = iso_moment(bucket["at"])
    if booking is not None:
        mine = reads.booking_of(booking)
        answer["booking"] = {
            "id": booking.pk,
            "user": mine.user,
            "start": iso_moment(booking.start),
            "end": iso_moment(booking.end),
            "verdict": verdict(
                mine,
                reads.entries(channel, booking.start - timedelta(days=1), booking.end),
                named,
                previous=reads.previous_booking(booking),
                estimate=reads.estimate(channel, booking.model_id, booking.preset_id),
                now=now,
                tz=tz,
            ),
        }
    return answer


def window(request: Request, booking: Reservation | None, now: datetime) -> tuple[datetime, datetime]:
    if booking is not None:
        default_start, default_end = booking.start - BEFORE_BOOKING, booking.end + AFTER_BOOKING
    else:
        default_start, default_end = now - RECENT, now
    start = moment_param(request, "from", default=default_start)
    end = moment_param(request, "to", default=max(default_end, start + timedelta(minutes=1)))
    return start, end


class StoryView(APIView):
    """``GET /api/channels/{id}/story?from=&to=&booking=``: what happened to the channel, oldest
    first, with the requests per minute (``requests.buckets``) and, for a booking, the verdict."""

    def get(self, request: Request, pk: int) -> Response:
        viewer = request.user
        assert isinstance(viewer, User)
        channel = channel_for(viewer, pk)
        booking = booking_on(channel, request.query_params.get("booking"), viewer)
        now = timezone.now()
        start, end = window(request, booking, now)
        return Response(
            story(
                channel=channel,
                viewer=viewer,
                start=start,
                end=end,
                booking=booking,
                now=now,
                tz=timezone.get_current_timezone(),
            )
        )
