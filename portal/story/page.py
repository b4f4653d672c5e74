"""A channel's story as a page, ``/channel/<id>/story`` (docs/scheduling.md, "A channel's story"):
the verdict for a booking first, the requests' chart, then every happening, oldest first. It
answers from the same ``story`` as the API (``portal.story.api``)."""

from __future__ import annotations

import re
from datetime import datetime, tzinfo
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

from portal.story.api import booking_on, channel_for, story, window

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
        channel = channel_for(viewer, pk)
    except NotFound:
        raise Http404("no channel with this id that you may use") from None
    answer: dict[str, Any] | None = None
    try:
        booking = booking_on(channel, request.GET.get("booking"), viewer)
        now = timezone.now()
        start, end = window(api_request, booking, now)
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
