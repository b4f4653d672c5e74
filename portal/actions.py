"""Portal pages that change one's bookings: my reservations, cancelling, ending, changing and
extending them, a series, the waitlist (booking itself: ``portal.booking``; approvals:
``portal.staff_actions``).

Each view translates a form into one service call and the service's refusal
into a message on the form, so a refused request keeps what the user typed.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, Q, QuerySet, Sum
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from channels_app.models import Preset
from portal.forms import (
    ChangeForm,
    ExtendForm,
)
from reservations import services
from reservations.models import Reservation, ReservationStatus, WaitlistEntry
from reservations.services import InvalidTransition, ReservationConflict
from slotserve_base.errors import InvalidInput
from slotserve_base.vocabulary import ErrorCode


def visible_reservations(request: HttpRequest) -> QuerySet[Reservation]:
    """Reservations the user may act on: their own; staff: all. Others answer 404."""
    queryset = Reservation.objects.select_related("channel", "user", "model", "preset")
    return queryset if request.user.is_staff else queryset.filter(user=me(request))


def refusal_to_form(form: Any, exc: Exception) -> None:
    if isinstance(exc, InvalidInput):
        field = exc.field if exc.field in form.fields else None
        form.add_error(field, exc.message)
    elif isinstance(exc, ReservationConflict | InvalidTransition):
        form.add_error(None, exc.message)
    else:
        raise exc


# Rows a list page of the portal shows (My reservations' upcoming, Approvals); the rest on the next.
PAGE = 50


def lent_words(reservations: list[Reservation]) -> None:
    """How much of each lent booking others used, and whether any of the booker's requests
    waited (docs/gateway.md, "Lending"), as ``reservation.lent``: a query per lent booking."""
    from gateway.models import RequestLog

    lent = [r for r in reservations if r.lend]
    for r in reservations:
        r.lent = ""  # type: ignore[attr-defined]
    if not lent:
        return
    # A borrowed request's row names no booking (it was not the booking's use): it is found by
    # its channel and time; the booker's own by their booking.
    found = {}
    for r in lent:
        in_slot = Q(channel_id=r.channel_id, at__gte=r.start, at__lt=r.end)
        found[r.pk] = RequestLog.objects.filter(Q(in_slot, borrowed=True) | Q(reservation=r)).aggregate(
            lent_n=Count("pk", filter=Q(borrowed=True)),
            busy=Sum("duration_ms", filter=Q(borrowed=True)),
            ended=Count("pk", filter=Q(borrowed=True, error_code=ErrorCode.PREEMPTED_BY_BOOKER)),
            waited=Count("pk", filter=Q(borrowed=False, queued_ms__gt=0)),
        )
    for r in lent:
        row = found.get(r.pk, {"lent_n": 0, "busy": 0, "ended": 0, "waited": 0})
        n = row["lent_n"]
        said = f"Lent: {n} request{'' if n == 1 else 's'} by others"
        if n:
            said += (
                f" (they ran {round((row['busy'] or 0) / 60000, 1)} min in all; {row['ended']} ended "
                "early to make room for yours)"
            )
        waited = row["waited"]
        said += "; none of yours waited" if not waited else f"; {waited} of yours waited for a place"
        r.lent = said + "."  # type: ignore[attr-defined]


@login_required
def my_reservations(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    mine = Reservation.objects.filter(user=me(request)).select_related("channel", "model", "preset")
    withdrawn = [ReservationStatus.CANCELLED, ReservationStatus.REJECTED]
    # A pending booking whose start has passed still waits for a decision until its end.
    upcoming = mine.filter(
        Q(status=ReservationStatus.APPROVED, start__gt=now) | Q(status=ReservationStatus.PENDING, end__gt=now)
    ).order_by("start", "pk")
    page = Paginator(upcoming, PAGE).get_page(request.GET.get("page"))
    active = list(mine.filter(status=ReservationStatus.APPROVED, start__lte=now, end__gt=now))
    past = list(mine.filter(end__lte=now).order_by("-start")[:50])
    lent_words(active + past)
    context = {
        "waiting": WaitlistEntry.objects.filter(user=me(request), notified_at__isnull=True, end__gt=now)
        .select_related("channel")
        .order_by("start"),
        "active": active,
        "upcoming": page,
        "page": page,
        "withdrawn": mine.filter(status__in=withdrawn, end__gt=now).order_by("start"),
        "past": past,
        "extend_form": ExtendForm(),
        "now": now,
    }
    return render(request, "portal/my_reservations.html", context)


@login_required
@require_POST
def leave_waitlist(request: HttpRequest, pk: int) -> HttpResponse:
    """Stop waiting for a slot (one's own wish only: another's is not found)."""
    entry = get_object_or_404(WaitlistEntry.objects.select_related("channel"), pk=pk, user=me(request))
    services.waitlist_leave(entry=entry, by=me(request))
    messages.success(request, f"You no longer wait for {entry.channel.name}.")
    return redirect("portal:my_reservations")


def staff_only(what: str) -> Callable[[Callable[..., HttpResponseBase]], Callable[..., HttpResponseBase]]:
    """A page for staff: a member signed in is told so on a portal page (403, ``what`` it is);
    someone signed out signs in first."""

    def wrap(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        @login_required
        @wraps(view)
        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not request.user.is_staff:
                raise PermissionDenied(f"{what} is for staff. Ask one of them if you need something from it.")
            return view(request, *args, **kwargs)

        return checked

    return wrap


def me(request: HttpRequest) -> User:
    """The signed-in user; every caller is behind ``login_required``."""
    assert isinstance(request.user, User), "view needs login_required"
    return request.user


def reservation_action(
    request: HttpRequest,
    pk: int,
    act: Callable[[Reservation], Reservation],
    done: str,
    back: str = "portal:my_reservations",
    among: QuerySet[Reservation] | None = None,
) -> HttpResponse:
    """``act`` on one of the reservations ``among`` (default: those the user may act on)."""
    reservation = get_object_or_404(visible_reservations(request) if among is None else among, pk=pk)
    try:
        act(reservation)
    except (InvalidInput, InvalidTransition, ReservationConflict) as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, done)
    return redirect(back)


@login_required
@require_POST
def cancel(request: HttpRequest, pk: int) -> HttpResponse:
    def act(r: Reservation) -> Reservation:
        return services.reservation_cancel(reservation=r, by=me(request), now=timezone.now())

    return reservation_action(request, pk, act, "Reservation cancelled.")


@login_required
@require_POST
def end(request: HttpRequest, pk: int) -> HttpResponse:
    def act(r: Reservation) -> Reservation:
        return services.reservation_end(reservation=r, by=me(request), now=timezone.now())

    return reservation_action(request, pk, act, "Reservation ended; the channel is free again.")


def _same_minute(shown: datetime, stored: datetime) -> bool:
    return shown == stored.replace(second=0, microsecond=0)


@login_required
@require_POST
def cancel_series(request: HttpRequest, pk: int) -> HttpResponse:
    """Cancel every occurrence of one of your series that has not started."""
    from reservations.models import ReservationSeries

    found = (
        ReservationSeries.objects.all()
        if request.user.is_staff
        else ReservationSeries.objects.filter(user=me(request))
    )
    series = get_object_or_404(found, pk=pk)
    cancelled = services.reservation_series_cancel(series=series, by=me(request), now=timezone.now())
    messages.success(request, f"{len(cancelled)} reservations of the series cancelled.")
    return redirect("portal:my_reservations")


@login_required
def change(request: HttpRequest, pk: int) -> HttpResponse:
    """Move, shorten or retarget a booking: the same checks as booking it (and a new approval
    where the channel's policy asks for one)."""
    reservation = get_object_or_404(visible_reservations(request), pk=pk)
    if request.method == "POST":
        form = ChangeForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            start_same = _same_minute(data["start"], reservation.start)
            end = None if _same_minute(data["end"], reservation.end) else data["end"]
            if not start_same and end is None:
                # A moved start with the end left as it was: the end follows, keeping the length.
                end = data["start"] + (reservation.end - reservation.start)
            try:
                changed = services.reservation_change(
                    reservation=reservation,
                    by=me(request),
                    now=timezone.now(),
                    # The form shows minutes: a time it shows unchanged is the time as it was.
                    start=None if start_same else data["start"],
                    end=end,
                    model=None if reservation.exclusive else data["model"],
                    preset=None if reservation.exclusive else data["preset"],
                    note=data["note"],
                    lend=data["lend"]
                    if reservation.user_id == request.user.pk
                    and (reservation.channel.lend_while_idle or reservation.lend)
                    else None,
                )
            except (InvalidInput, InvalidTransition, ReservationConflict) as exc:
                refusal_to_form(form, exc)
            else:
                state = " It awaits approval again." if changed.status == ReservationStatus.PENDING else ""
                messages.success(request, f"Reservation changed.{state}")
                return redirect("portal:my_reservations")
    else:
        form = ChangeForm(
            initial={
                "start": timezone.localtime(reservation.start),
                "end": timezone.localtime(reservation.end),
                "model": reservation.model_id,
                "preset": reservation.preset_id,
                "note": reservation.note,
                "lend": reservation.lend,
            }
        )
    # The booking's length, so that the page says when a change would alter it.
    length = int((reservation.end - reservation.start).total_seconds() // 60)
    form.fields["end"].widget.attrs["data-length-was"] = str(length)
    presets = [{"id": p.pk, "model": p.model_id, "name": p.name} for p in Preset.objects.all()]
    context = {
        "form": form,
        "reservation": reservation,
        "presets": presets,
        "started": reservation.start <= timezone.now(),
        # The booker's own choice, where the channel lends (or to take a lending back).
        "lendable": not reservation.exclusive
        and reservation.user_id == request.user.pk
        and (reservation.channel.lend_while_idle or reservation.lend),
    }
    return render(request, "portal/change.html", context)


@login_required
@require_POST
def extend(request: HttpRequest, pk: int) -> HttpResponse:
    get_object_or_404(
        visible_reservations(request), pk=pk
    )  # someone else's answers 404 before any validation
    form = ExtendForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give the new end as a date and time.")
        return redirect("portal:my_reservations")

    def act(r: Reservation) -> Reservation:
        holder = services.reservation_extend(
            reservation=r, by=me(request), end=form.cleaned_data["end"], now=timezone.now()
        )
        if holder.pk != r.pk:
            messages.info(request, "The extension awaits approval; the booked time stays approved.")
        return holder

    return reservation_action(request, pk, act, "Reservation extended.")


# How far back the calendar feed reaches.
FEED_DAYS_BACK = 30
