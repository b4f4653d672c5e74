"""A channel's story (docs/scheduling.md, "A channel's story"): the page ``/channel/<id>/story``
and ``GET /api/channels/{id}/story?from=&to=&booking=``.

Members read the story of the channels they may book, with the requests counted but not whose;
staff read every channel's, with who sent the requests. ``booking`` centres the window on a
booking and says why its model was, or was not, ready at its start.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, tzinfo
from typing import Any

import pygal
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from pygal.style import Style
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from channels_app.models import Channel
from reservations.models import Reservation, ReservationStatus
from slotserve_base.api_fields import is_id, moment_param
from slotserve_base.iso import iso_moment
from slotserve_site.story import reads
from slotserve_site.story.telling import lines, verdict

# The longest window one answer tells.
MAX_WINDOW = timedelta(days=7)
# A window without ``from``: the last hours.
RECENT = timedelta(hours=6)
# Around a booking: the preload before it, and what followed it.
BEFORE_BOOKING = timedelta(minutes=30)
AFTER_BOOKING = timedelta(minutes=10)


def _channel(viewer: User, pk: int) -> Channel:
    channel = reads.channels_for(viewer).select_related("node").filter(pk=pk).first()
    if channel is None:
        raise NotFound("no channel with this id that you may use")
    return channel


# Others' bookings a member may read the verdict of: those the calendar shows everyone.
SHOWN_TO_ALL = [ReservationStatus.PENDING, ReservationStatus.APPROVED, ReservationStatus.ENDED]


def _booking(channel: Channel, raw: str | None, viewer: User) -> Reservation | None:
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


def _window(request: Request, booking: Reservation | None, now: datetime) -> tuple[datetime, datetime]:
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
        channel = _channel(viewer, pk)
        booking = _booking(channel, request.query_params.get("booking"), viewer)
        now = timezone.now()
        start, end = _window(request, booking, now)
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


CHART_STYLE = Style(
    background="transparent", plot_background="transparent", colors=("#1e7b45", "#b3261e", "#f0a33a")
)


def _chart(requests: dict[str, Any], tz: tzinfo) -> str:
    buckets = requests["buckets"]
    if not buckets:
        return ""
    chart = pygal.StackedBar(
        style=CHART_STYLE,
        js=[],
        explicit_size=False,
        height=220,
        legend_at_bottom=True,
        show_minor_x_labels=False,
        x_label_rotation=20,
        title={60: "Requests per minute", 300: "Requests per 5 minutes"}.get(
            requests["bucket_seconds"], "Requests per hour"
        ),
    )
    chart.x_labels = [datetime.fromisoformat(b["at"]).astimezone(tz).strftime("%H:%M") for b in buckets]
    chart.x_labels_major_every = max(1, len(buckets) // 12)
    chart.add("served", [b["served"] - b["waited"] if b["served"] >= b["waited"] else 0 for b in buckets])
    chart.add("refused", [b["refused"] for b in buckets])
    chart.add("served after a wait", [min(b["waited"], b["served"]) for b in buckets])
    svg = str(chart.render(is_unicode=True, disable_xml_declaration=True))
    return re.sub(r"<script\b.*?</script>", "", svg, flags=re.S)


@login_required
def story_page(request: HttpRequest, pk: int) -> HttpResponse:
    """The story on one time axis: the verdict for a booking first, the requests' chart, then
    every happening, oldest first."""
    viewer = request.user
    assert isinstance(viewer, User)
    api_request = Request(request)
    tz = timezone.get_current_timezone()
    errors: dict[str, Any] = {}
    try:
        channel = _channel(viewer, pk)
    except NotFound:
        raise Http404("no channel with this id that you may use") from None
    answer: dict[str, Any] | None = None
    try:
        booking = _booking(channel, request.GET.get("booking"), viewer)
        now = timezone.now()
        start, end = _window(api_request, booking, now)
        answer = story(channel=channel, viewer=viewer, start=start, end=end, booking=booking, now=now, tz=tz)
    except serializers.ValidationError as exc:
        errors = exc.detail if isinstance(exc.detail, dict) else {"query": exc.detail}
    context = {
        "channel": channel,
        "story": answer,
        "errors": errors,
        "chart": _chart(answer["requests"], tz) if answer else "",
        "lines": [{**line, "at": datetime.fromisoformat(line["at"])} for line in answer["lines"]]
        if answer
        else [],
        "filters": {"from": request.GET.get("from", ""), "to": request.GET.get("to", "")},
        "window": [datetime.fromisoformat(answer[end]) for end in ("from", "to")] if answer else [],
    }
    return render(request, "portal/story.html", context, status=400 if errors else 200)
