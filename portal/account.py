"""A user's own corner of the portal: notifications, preferences and time zone, API keys, their
requests, and the calendar feed."""

from __future__ import annotations

import hashlib
from datetime import datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.cache import add_never_cache_headers, get_conditional_response
from django.views.decorators.http import require_POST
from icalendar import Calendar, Event

from channels_app.models import LLMModel
from gateway.api_keys import api_key_create, api_key_revoke
from gateway.models import ApiKey
from portal.actions import FEED_DAYS_BACK, me
from portal.forms import (
    ApiKeyForm,
    PreferencesForm,
)
from reservations.models import Notification, Profile, Reservation, ReservationStatus
from reservations.profiles import profile_for, profile_set_time_zone
from reservations.wording import zone_of
from slotserve_base import overview
from slotserve_base.errors import InvalidInput
from slotserve_base.public_url import public_url
from slotserve_base.vocabulary import NotificationEvent


@login_required
def notifications(request: HttpRequest) -> HttpResponse:
    """The user's notifications, newest first; opening the page marks them read (the new ones
    still show as new this once)."""
    mine = Notification.objects.filter(user=me(request))
    if request.method == "POST":  # "mark all read" from older pages and scripts
        mine.filter(read=False).update(read=True)
        return redirect("portal:notifications")
    shown = list(mine[:200])
    response = render(request, "portal/notifications.html", {"notifications": shown})
    if mine.filter(read=False, pk__in=[n.pk for n in shown]).update(read=True):
        overview.counts_changed([me(request).pk])  # the badge on their other open pages
    return response


@login_required
def preferences(request: HttpRequest) -> HttpResponse:
    profile = profile_for(me(request))
    if request.method == "POST":
        form = PreferencesForm(request.POST)
        if form.is_valid():
            profile_set_time_zone(me(request), form.cleaned_data["time_zone"])
            profile.refresh_from_db()
            profile.email_events = {e.value: form.cleaned_data[f"email_{e.value}"] for e in NotificationEvent}
            profile.save(update_fields=["email_events"])
            messages.success(request, "Settings saved.")
            return redirect("portal:preferences")
    else:
        initial: dict[str, Any] = {"time_zone": profile.time_zone}
        initial.update({f"email_{e.value}": profile.wants_email(e.value) for e in NotificationEvent})
        form = PreferencesForm(initial=initial)
    feed = public_url(f"/calendar/{profile.calendar_token}.ics", request)
    return render(request, "portal/preferences.html", {"form": form, "feed": feed})


@login_required
@require_POST
def set_time_zone(request: HttpRequest) -> HttpResponse:
    """The page's script sends the browser's zone: taken at first sign-in (``detected=1``), or
    when the user accepts the offer to switch. JSON: the zone now, and whether it changed."""
    try:
        changed = profile_set_time_zone(
            me(request),
            request.POST.get("time_zone", ""),
            detected=request.POST.get("detected") == "1",
        )
    except InvalidInput as problem:
        return JsonResponse({"message": problem.message, "field": problem.field}, status=400)
    return JsonResponse({"time_zone": profile_for(me(request)).time_zone, "changed": changed})


@login_required
def keys(request: HttpRequest) -> HttpResponse:
    new_key = None
    form = ApiKeyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        given = form.cleaned_data
        # The last day it works, in the user's zone: it stops at the midnight after it.
        last = given["expires"]
        expires = (
            datetime.combine(last + timedelta(days=1), time(), tzinfo=timezone.get_current_timezone())
            if last
            else None
        )
        try:
            _, new_key = api_key_create(
                user=me(request),
                name=given["name"],
                wait_seconds=given["wait_seconds"],
                models=given["models"],
                channels=given["channels"],
                expires_at=expires,
                read_only=given["read_only"],
            )
        except InvalidInput as exc:
            form.add_error("expires", exc.message)
        else:
            form = ApiKeyForm()
    mine = ApiKey.objects.filter(user=me(request), revoked_at__isnull=True).prefetch_related(
        "models_allowed", "channels_allowed"
    )
    context = {
        "form": form,
        "keys": mine,
        "new_key": new_key,
        "base_url": public_url("/v1", request),
        "a_model": LLMModel.objects.order_by("name").values_list("name", flat=True).first() or "MODEL",
    }
    page = render(request, "portal/keys.html", context)
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

    viewer = me(request)
    rows = RequestLog.objects.select_related("user", "key", "channel").prefetch_related(
        "key__models_allowed", "key__channels_allowed"
    )
    if not viewer.is_staff:
        rows = rows.filter(user=viewer)
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
    api_key = get_object_or_404(ApiKey, pk=pk, user=me(request))
    api_key_revoke(api_key=api_key)
    messages.success(request, f"Key {api_key.name} revoked.")
    return redirect("portal:keys")


def calendar_feed(request: HttpRequest, token: str) -> HttpResponse:
    """The user's reservations as iCalendar; the URL's token is the credential."""
    try:
        profile = Profile.objects.select_related("user").get(calendar_token=token)
    except Profile.DoesNotExist:
        raise Http404("no such calendar") from None
    # A window, not every booking ever: from FEED_DAYS_BACK days ago on (calendar programs keep
    # what they fetched before).
    since = timezone.now() - timedelta(days=FEED_DAYS_BACK)
    reservations = list(
        Reservation.objects.filter(
            user=profile.user,
            status__in=[ReservationStatus.PENDING, ReservationStatus.APPROVED, ReservationStatus.ENDED],
            end__gt=since,
        ).select_related("channel", "model")
    )
    zone = zone_of(profile.user)
    host = request.get_host()
    # Calendar programs fetch the feed every few minutes: one whose copy is current (the same
    # bookings, as shown, in the same zone) is told so (304), and nothing is built.
    shown = [
        (r.pk, r.status, r.start, r.end, r.channel.name, r.exclusive, r.model.name if r.model else "", r.note)
        for r in reservations
    ]
    etag = '"' + hashlib.sha256(repr((shown, str(zone), host)).encode()).hexdigest()[:32] + '"'
    unchanged = get_conditional_response(request, etag=etag)
    if unchanged is not None:
        return unchanged
    calendar = Calendar()
    calendar.add("prodid", "-//SlotServe//reservations//EN")
    calendar.add("version", "2.0")
    calendar.add("x-wr-calname", "SlotServe reservations")
    calendar.add("x-wr-timezone", str(zone))
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
    answer = HttpResponse(calendar.to_ical(), content_type="text/calendar; charset=utf-8")
    answer["ETag"] = etag
    return answer
