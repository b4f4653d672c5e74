"""The booking page, ``/book/``: a booking, a series of them or the best channel that fits,
from the dialog's form to one service call; a refusal stays on the form with what was typed
(docs/portal.md). The dialog opens with the calendar's or the free-slot finder's choice."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from channels_app.models import Channel, LLMModel, Preset
from portal.actions import me, refusal_to_form
from portal.forms import (
    BookingForm,
)
from reservations import services
from reservations.models import ReservationStatus
from reservations.services import ReservationConflict, SeriesConflict
from reservations.wording import slot_words
from slotserve_base.api_fields import in_range, is_id
from slotserve_base.errors import InvalidInput


@login_required
def book(request: HttpRequest) -> HttpResponse:
    conflicts: list[Any] = []
    if request.method == "POST":
        form = BookingForm(request.POST, user=me(request))
        if form.is_valid():
            data = form.cleaned_data
            whole_card = data["exclusive"]
            booking = services.NewBooking(
                user=me(request),
                channel=data["channel"],
                start=data["start"],
                end=data["end"],
                model=None if whole_card else data["model"],
                preset=None if whole_card else data["preset"],
                exclusive=whole_card,
                note=data["note"],
                lend=data["lend"] and not whole_card,
            )
        if form.is_valid() and data["repeat"]:
            try:
                repeat = services.Repeat(
                    repeat=data["repeat"],
                    until=data["until"],
                    count=data["count"],
                    every=data["every"] or 1,
                    on_days=tuple(sorted(data["on_days"])) if data["repeat"] == "weekly" else (),
                    time_zone=timezone.get_current_timezone_name(),
                )
                _, made, skipped = services.reservation_series_create(
                    booking, repeat, now=timezone.now(), skip_conflicts=data["skip_conflicts"]
                )
            except SeriesConflict as exc:
                total = len(exc.problems) + exc.booked
                others = (
                    ' To book the others, tick "Book the others" and book again.'
                    if exc.booked and not data["skip_conflicts"]
                    else ""
                )
                form.add_error(
                    None,
                    f"{len(exc.problems)} of {total} occurrences cannot be booked, "
                    f"so none was (listed below).{others}",
                )
                conflicts = exc.problems
            except (InvalidInput, ReservationConflict) as exc:
                refusal_to_form(form, exc)
            else:
                state = " They await approval." if made[0].status == ReservationStatus.PENDING else ""
                left_out = "".join(
                    f" Skipped {slot_words(s, e, timezone.get_current_timezone())}: {why}."
                    for s, e, why in skipped
                )
                messages.success(
                    request, f"{len(made)} reservations of {made[0].channel} booked.{state}{left_out}"
                )
                return redirect("portal:my_reservations")
        elif form.is_valid():
            create = services.reservation_create if data["channel"] else services.reservation_create_anywhere
            try:
                reservation = create(booking, now=timezone.now())
            except (InvalidInput, ReservationConflict) as exc:
                refusal_to_form(form, exc)
            else:
                state = "awaits approval" if reservation.status == ReservationStatus.PENDING else "is booked"
                messages.success(request, f"Your reservation of {reservation.channel} {state}.")
                return redirect("portal:my_reservations")
    else:
        form = BookingForm(initial=_prefilled(request), user=me(request))
    presets = [{"id": p.pk, "model": p.model_id, "name": p.name} for p in Preset.objects.all()]
    # For the model list's own "exceeds the GPU memory" marks (per chosen channel).
    channels = Channel.objects.select_related("node").prefetch_related("node__gpus")
    fit = {
        "vram": {str(c.pk): c.vram_bytes() for c in channels},
        "sizes": {str(pk): size for pk, size in LLMModel.objects.values_list("pk", "size_bytes")},
        "lends": [str(c.pk) for c in channels if c.lend_while_idle],
        # Each channel's own preset: the one a model's preset starts at (book.html).
        "defaults": {str(c.pk): c.default_preset_id for c in channels if c.default_preset_id},
    }
    return render(
        request, "portal/book.html", {"form": form, "presets": presets, "fit": fit, "conflicts": conflicts}
    )


def _prefilled(request: HttpRequest) -> dict[str, Any]:
    """The dialog's first values: from the calendar (a channel, and the free time clicked or
    dragged over, as ISO times) or the free-slot finder; else the next full hour."""
    initial: dict[str, Any] = {}
    for name in ("channel", "model", "preset"):
        if is_id(request.GET.get(name, "")):
            initial[name] = request.GET[name]
    start, end = _moment(request.GET.get("start")), _moment(request.GET.get("end"))
    if start is None:
        start = (timezone.localtime() + timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
    if end is None or end <= start:
        end = start + timedelta(hours=1)
    initial.update(start=timezone.localtime(start), end=timezone.localtime(end))
    return initial


def _moment(raw: str | None) -> datetime | None:
    """An ISO time with an offset from a link; None when there is none or it is not one."""
    if not raw or len(raw) > 40:
        return None
    try:
        value = parse_datetime(raw.replace(" ", "+"))
    except ValueError:
        return None
    if value is None or timezone.is_naive(value) or not in_range(value):
        return None
    return value
