"""Portal pages that change things: booking, my reservations, approvals, settings, keys.

Each view translates a form into one service call and the service's refusal
into a message on the form, so a refused request keeps what the user typed.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST
from icalendar import Calendar, Event

from channels_app.models import Channel, LLMModel, Preset
from channels_app.scheduling.services import channel_reload, override_clear, override_set
from gateway.api_keys import api_key_create, api_key_revoke
from gateway.models import ApiKey
from portal.forms import (
    ApiKeyForm,
    BookingForm,
    ChangeForm,
    ExtendForm,
    OverrideForm,
    PreferencesForm,
    RejectForm,
)
from reservations import services
from reservations.models import Notification, Profile, Reservation, ReservationStatus
from reservations.profiles import profile_for, profile_set_time_zone
from reservations.selectors import reviewable_by
from reservations.services import InvalidTransition, ReservationConflict, SeriesConflict
from reservations.wording import zone_of
from slotserve_base.api_fields import in_range
from slotserve_base.errors import InvalidInput
from slotserve_base.vocabulary import NotificationEvent


def _visible(request: HttpRequest) -> QuerySet[Reservation]:
    """Reservations the user may act on: their own; staff: all. Others answer 404."""
    queryset = Reservation.objects.select_related("channel", "user", "model", "preset")
    return queryset if request.user.is_staff else queryset.filter(user=_me(request))


def _refusal_to_form(form: Any, exc: Exception) -> None:
    if isinstance(exc, InvalidInput):
        field = exc.field if exc.field in form.fields else None
        form.add_error(field, exc.message)
    elif isinstance(exc, ReservationConflict | InvalidTransition):
        form.add_error(None, exc.message)
    else:
        raise exc


@login_required
def book(request: HttpRequest) -> HttpResponse:
    conflicts: list[Any] = []
    if request.method == "POST":
        form = BookingForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            booking: dict[str, Any] = {
                "user": _me(request),
                "now": timezone.now(),
                "channel": data["channel"],
                "start": data["start"],
                "end": data["end"],
                "model": None if data["exclusive"] else data["model"],
                "preset": None if data["exclusive"] else data["preset"],
                "exclusive": data["exclusive"],
                "note": data["note"],
            }
        if form.is_valid() and data["repeat"]:
            try:
                _, made = services.reservation_series_create(
                    **booking,
                    repeat=data["repeat"],
                    until=data["until"],
                    count=data["count"],
                    time_zone=timezone.get_current_timezone_name(),
                )
            except SeriesConflict as exc:
                total = len(exc.problems) + exc.booked
                form.add_error(
                    None,
                    f"{len(exc.problems)} of {total} occurrences cannot be booked, "
                    "so none was (listed below).",
                )
                conflicts = exc.problems
            except (InvalidInput, ReservationConflict) as exc:
                _refusal_to_form(form, exc)
            else:
                state = " They await approval." if made[0].status == ReservationStatus.PENDING else ""
                messages.success(request, f"{len(made)} reservations of {made[0].channel} booked.{state}")
                return redirect("portal:my_reservations")
        elif form.is_valid():
            create = services.reservation_create if data["channel"] else services.reservation_create_anywhere
            try:
                reservation = create(**booking)
            except (InvalidInput, ReservationConflict) as exc:
                _refusal_to_form(form, exc)
            else:
                state = "awaits approval" if reservation.status == ReservationStatus.PENDING else "is booked"
                messages.success(request, f"Your reservation of {reservation.channel} {state}.")
                return redirect("portal:my_reservations")
    else:
        form = BookingForm(initial=_prefilled(request))
    presets = [{"id": p.pk, "model": p.model_id, "name": p.name} for p in Preset.objects.all()]
    # For the model list's own "exceeds the GPU memory" marks (per chosen channel).
    channels = Channel.objects.select_related("node").prefetch_related("node__gpus")
    fit = {
        "vram": {str(c.pk): c.vram_bytes() for c in channels},
        "sizes": {str(pk): size for pk, size in LLMModel.objects.values_list("pk", "size_bytes")},
    }
    return render(
        request, "portal/book.html", {"form": form, "presets": presets, "fit": fit, "conflicts": conflicts}
    )


def _prefilled(request: HttpRequest) -> dict[str, Any]:
    """The dialog's first values: from the calendar (a channel, and the free time clicked or
    dragged over, as ISO times) or the free-slot finder; else the next full hour."""
    initial: dict[str, Any] = {}
    for name in ("channel", "model", "preset"):
        if request.GET.get(name, "").isdigit():
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


# Rows a list page of the portal shows (My reservations' upcoming, Approvals); the rest on the next.
PAGE = 50


@login_required
def my_reservations(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    mine = Reservation.objects.filter(user=_me(request)).select_related("channel", "model", "preset")
    withdrawn = [ReservationStatus.CANCELLED, ReservationStatus.REJECTED]
    # A pending booking whose start has passed still waits for a decision until its end.
    upcoming = mine.filter(
        Q(status=ReservationStatus.APPROVED, start__gt=now) | Q(status=ReservationStatus.PENDING, end__gt=now)
    ).order_by("start", "pk")
    page = Paginator(upcoming, PAGE).get_page(request.GET.get("page"))
    context = {
        "active": mine.filter(status=ReservationStatus.APPROVED, start__lte=now, end__gt=now),
        "upcoming": page,
        "page": page,
        "withdrawn": mine.filter(status__in=withdrawn, end__gt=now).order_by("start"),
        "past": mine.filter(end__lte=now).order_by("-start")[:50],
        "extend_form": ExtendForm(),
        "now": now,
    }
    return render(request, "portal/my_reservations.html", context)


def _me(request: HttpRequest) -> User:
    """The signed-in user; every caller is behind ``login_required``."""
    assert isinstance(request.user, User), "view needs login_required"
    return request.user


def _reservation_action(
    request: HttpRequest,
    pk: int,
    act: Callable[[Reservation], Reservation],
    done: str,
    back: str = "portal:my_reservations",
    among: QuerySet[Reservation] | None = None,
) -> HttpResponse:
    """``act`` on one of the reservations ``among`` (default: those the user may act on)."""
    reservation = get_object_or_404(_visible(request) if among is None else among, pk=pk)
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
        return services.reservation_cancel(reservation=r, by=_me(request), now=timezone.now())

    return _reservation_action(request, pk, act, "Reservation cancelled.")


@login_required
@require_POST
def end(request: HttpRequest, pk: int) -> HttpResponse:
    def act(r: Reservation) -> Reservation:
        return services.reservation_end(reservation=r, by=_me(request), now=timezone.now())

    return _reservation_action(request, pk, act, "Reservation ended; the channel is free again.")


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
        else ReservationSeries.objects.filter(user=_me(request))
    )
    series = get_object_or_404(found, pk=pk)
    cancelled = services.reservation_series_cancel(series=series, by=_me(request), now=timezone.now())
    messages.success(request, f"{len(cancelled)} reservations of the series cancelled.")
    return redirect("portal:my_reservations")


@login_required
def change(request: HttpRequest, pk: int) -> HttpResponse:
    """Move, shorten or retarget a booking: the same checks as booking it (and a new approval
    where the channel's policy asks for one)."""
    reservation = get_object_or_404(_visible(request), pk=pk)
    if request.method == "POST":
        form = ChangeForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            try:
                changed = services.reservation_change(
                    reservation=reservation,
                    by=_me(request),
                    now=timezone.now(),
                    # The form shows minutes: a time it shows unchanged is the time as it was.
                    start=None if _same_minute(data["start"], reservation.start) else data["start"],
                    end=None if _same_minute(data["end"], reservation.end) else data["end"],
                    model=None if reservation.exclusive else data["model"],
                    preset=None if reservation.exclusive else data["preset"],
                    note=data["note"],
                )
            except (InvalidInput, InvalidTransition, ReservationConflict) as exc:
                _refusal_to_form(form, exc)
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
            }
        )
    presets = [{"id": p.pk, "model": p.model_id, "name": p.name} for p in Preset.objects.all()]
    context = {
        "form": form,
        "reservation": reservation,
        "presets": presets,
        "started": reservation.start <= timezone.now(),
    }
    return render(request, "portal/change.html", context)


@login_required
@require_POST
def extend(request: HttpRequest, pk: int) -> HttpResponse:
    get_object_or_404(_visible(request), pk=pk)  # someone else's answers 404 before any validation
    form = ExtendForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give the new end as a date and time.")
        return redirect("portal:my_reservations")

    def act(r: Reservation) -> Reservation:
        holder = services.reservation_extend(
            reservation=r, by=_me(request), end=form.cleaned_data["end"], now=timezone.now()
        )
        if holder.pk != r.pk:
            messages.info(request, "The extension awaits approval; the booked time stays approved.")
        return holder

    return _reservation_action(request, pk, act, "Reservation extended.")


def _approver_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Staff, or a group's approver; others answer 403."""

    @login_required
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not (request.user.is_staff or _me(request).approves_for.exists()):
            raise PermissionDenied("only staff and group approvers decide bookings")
        return view(request, *args, **kwargs)

    return checked


@_approver_required
def approvals(request: HttpRequest) -> HttpResponse:
    pending = (
        reviewable_by(_me(request))
        .filter(status=ReservationStatus.PENDING)
        .select_related("user", "channel", "model", "preset")
    )
    # The nearest first: what must be decided soonest.
    page = Paginator(pending.order_by("start", "pk"), PAGE).get_page(request.GET.get("page"))
    return render(
        request, "portal/approvals.html", {"pending": page, "page": page, "reject_form": RejectForm()}
    )


@_approver_required
@require_POST
def approve(request: HttpRequest, pk: int) -> HttpResponse:
    def act(r: Reservation) -> Reservation:
        return services.reservation_approve(reservation=r, by=_me(request), now=timezone.now())

    return _reservation_action(
        request, pk, act, "Approved.", back="portal:approvals", among=reviewable_by(_me(request))
    )


@_approver_required
@require_POST
def reject(request: HttpRequest, pk: int) -> HttpResponse:
    form = RejectForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Say why the reservation is rejected.")
        return redirect("portal:approvals")

    def act(r: Reservation) -> Reservation:
        return services.reservation_reject(
            reservation=r, by=_me(request), reason=form.cleaned_data["reason"], now=timezone.now()
        )

    return _reservation_action(
        request, pk, act, "Rejected.", back="portal:approvals", among=reviewable_by(_me(request))
    )


@staff_member_required
@require_POST
def channel_override(request: HttpRequest, pk: int) -> HttpResponse:
    channel = get_object_or_404(Channel, pk=pk)
    if request.POST.get("clear"):
        override_clear(channel=channel)
        messages.success(request, f"Override of {channel} cleared.")
        return redirect("portal:overview")
    form = OverrideForm(request.POST, prefix=f"ch{pk}")
    if not form.is_valid():
        messages.error(request, f"Override of {channel}: give a model or unload, and until when.")
        return redirect("portal:overview")
    data = form.cleaned_data
    try:
        override_set(
            channel=channel,
            now=timezone.now(),
            by=_me(request),
            model=data["model"],
            preset=data["preset"],
            unload=data["unload"],
            until=data["until"],
        )
    except InvalidInput as exc:
        messages.error(request, f"Override of {channel}: {exc.message}")
    else:
        messages.success(request, f"Override of {channel} set.")
    return redirect("portal:overview")


@staff_member_required
@require_POST
def channel_reload_view(request: HttpRequest, pk: int) -> HttpResponse:
    channel = get_object_or_404(Channel, pk=pk)
    channel_reload(channel=channel, now=timezone.now(), by=_me(request))
    messages.success(request, f"{channel} restarts its process now.")
    return redirect("portal:overview")


@login_required
def notifications(request: HttpRequest) -> HttpResponse:
    mine = Notification.objects.filter(user=_me(request))
    if request.method == "POST":
        mine.filter(read=False).update(read=True)
        return redirect("portal:notifications")
    return render(request, "portal/notifications.html", {"notifications": mine[:200]})


@login_required
def preferences(request: HttpRequest) -> HttpResponse:
    profile = profile_for(_me(request))
    if request.method == "POST":
        form = PreferencesForm(request.POST)
        if form.is_valid():
            profile_set_time_zone(_me(request), form.cleaned_data["time_zone"])
            profile.refresh_from_db()
            profile.email_events = {e.value: form.cleaned_data[f"email_{e.value}"] for e in NotificationEvent}
            profile.save(update_fields=["email_events"])
            messages.success(request, "Settings saved.")
            return redirect("portal:preferences")
    else:
        initial: dict[str, Any] = {"time_zone": profile.time_zone}
        initial.update({f"email_{e.value}": profile.wants_email(e.value) for e in NotificationEvent})
        form = PreferencesForm(initial=initial)
    feed = request.build_absolute_uri(f"/calendar/{profile.calendar_token}.ics")
    return render(request, "portal/preferences.html", {"form": form, "feed": feed})


@login_required
@require_POST
def set_time_zone(request: HttpRequest) -> HttpResponse:
    """The page's script sends the browser's zone: taken at first sign-in (``detected=1``), or
    when the user accepts the offer to switch. JSON: the zone now, and whether it changed."""
    try:
        changed = profile_set_time_zone(
            _me(request), request.POST.get("time_zone", ""), detected=request.POST.get("detected") == "1"
        )
    except InvalidInput as problem:
        return JsonResponse({"message": problem.message, "field": problem.field}, status=400)
    return JsonResponse({"time_zone": profile_for(_me(request)).time_zone, "changed": changed})


@login_required
def keys(request: HttpRequest) -> HttpResponse:
    new_key = None
    form = ApiKeyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        _, new_key = api_key_create(
            user=_me(request), name=form.cleaned_data["name"], wait_seconds=form.cleaned_data["wait_seconds"]
        )
        form = ApiKeyForm()
    mine = ApiKey.objects.filter(user=_me(request), revoked_at__isnull=True)
    page = render(request, "portal/keys.html", {"form": form, "keys": mine, "new_key": new_key})
    # The page may show a new key: no browser or proxy may keep a copy of it.
    add_never_cache_headers(page)
    page["Cache-Control"] = "no-store, no-cache, must-revalidate, private, max-age=0"
    return page


@login_required
def my_requests(request: HttpRequest) -> HttpResponse:
    """The caller's last requests through the gateway (staff: everyone's, ``?user=`` to pick),
    with the same filters as ``/api/requests/`` and a CSV download of them."""
    from gateway.filters import RequestLogFilter
    from gateway.models import RequestLog

    me = _me(request)
    rows = RequestLog.objects.select_related("user", "key", "channel")
    if not me.is_staff:
        rows = rows.filter(user=me)
    found = RequestLogFilter(request.GET, queryset=rows)
    shown = list(found.qs[:200]) if found.is_valid() else []
    query = request.GET.urlencode()
    return render(
        request,
        "portal/requests.html",
        {
            "rows": shown,
            "errors": found.errors,
            "query": query,
            "filters": request.GET,
            "retention_days": settings.SLOTSERVE_REQUEST_LOG_DAYS,
        },
    )


@login_required
@require_POST
def revoke_key(request: HttpRequest, pk: int) -> HttpResponse:
    api_key = get_object_or_404(ApiKey, pk=pk, user=_me(request))
    api_key_revoke(api_key=api_key)
    messages.success(request, f"Key {api_key.name} revoked.")
    return redirect("portal:keys")


# How far back the calendar feed reaches.
FEED_DAYS_BACK = 30


def calendar_feed(request: HttpRequest, token: str) -> HttpResponse:
    """The user's reservations as iCalendar; the URL's token is the credential."""
    try:
        profile = Profile.objects.select_related("user").get(calendar_token=token)
    except Profile.DoesNotExist:
        raise Http404("no such calendar") from None
    calendar = Calendar()
    calendar.add("prodid", "-//SlotServe//reservations//EN")
    calendar.add("version", "2.0")
    calendar.add("x-wr-calname", "SlotServe reservations")
    # A window, not every booking ever: from FEED_DAYS_BACK days ago on (calendar programs keep
    # what they fetched before).
    since = timezone.now() - timedelta(days=FEED_DAYS_BACK)
    reservations = Reservation.objects.filter(
        user=profile.user,
        status__in=[ReservationStatus.PENDING, ReservationStatus.APPROVED, ReservationStatus.ENDED],
        end__gt=since,
    ).select_related("channel", "model", "preset")
    zone = zone_of(profile.user)
    calendar.add("x-wr-timezone", str(zone))
    host = request.get_host()
    for r in reservations:
        event = Event()
        what = "whole card" if r.exclusive else (r.model.name if r.model else "")
        event.add("uid", f"reservation-{r.pk}@{host}")
        event.add("summary", f"{r.channel.name}: {what}" + (" (pending)" if r.status == "pending" else ""))
        # In the user's zone (with its VTIMEZONE), as the portal shows them.
        event.add("dtstart", r.start.astimezone(zone))
        event.add("dtend", r.end.astimezone(zone))
        event.add("dtstamp", r.created)
        if r.note:
            event.add("description", r.note)
        calendar.add_component(event)
    calendar.add_missing_timezones()
    return HttpResponse(calendar.to_ical(), content_type="text/calendar; charset=utf-8")
