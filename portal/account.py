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

from gateway.admit.snapshot import channel_views_now
from gateway.api_keys import api_key_create, api_key_revoke
from gateway.models import ApiKey
from gateway.rules.key_scope import callable_now
from portal.actions import FEED_DAYS_BACK, me
from portal.feed import FeedEvent, feed_ical
from portal.forms import (
    ApiKeyForm,
    PreferencesForm,
)
from reservations.models import Notification, Profile, Reservation, ReservationStatus
from reservations.profiles import profile_for, profile_set_time_zone, profile_set_week_start, user_set_email
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
            user_set_email(me(request), form.cleaned_data["email"])
            if form.cleaned_data["week_start"] is not None:
                profile_set_week_start(me(request), form.cleaned_data["week_start"])
            profile_set_time_zone(me(request), form.cleaned_data["time_zone"])
            profile.refresh_from_db()
            profile.email_events = {e.value: form.cleaned_data[f"email_{e.value}"] for e in NotificationEvent}
            profile.save(update_fields=["email_events"])
            messages.success(request, "Settings saved.")
            return redirect("portal:preferences")
    else:
        initial: dict[str, Any] = {
            "time_zone": profile.time_zone,
            "email": me(request).email,
            "week_start": profile.week_start,
        }
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
    scope: dict[str, frozenset[Any] | None] = {}
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
                max_concurrent=given["max_concurrent"],
                requests_per_minute=given["requests_per_minute"],
                weekly_tokens=given["weekly_tokens"],
            )
        except InvalidInput as exc:
            form.add_error("expires", exc.message)
        else:
            form = ApiKeyForm()
            scope = {
                "models_allowed": frozenset(m.name for m in given["models"]) or None,
                "channels_allowed": frozenset(c.pk for c in given["channels"]) or None,
            }
    # The snippets call a model the person may call now (through the new key's scope).
    callable_models = callable_now(
        caller_id=me(request).pk, channels=channel_views_now(), now=timezone.now(), **scope
    )
    mine = list(
        ApiKey.objects.filter(user=me(request), revoked_at__isnull=True, playground=False).prefetch_related(
            "models_allowed", "channels_allowed"
        )
    )
    used = key_use(me(request), since=timezone.now() - KEY_USE_DAYS)
    for listed in mine:
        listed.used = used.get(listed.pk)  # type: ignore[attr-defined]
    context = {
        "form": form,
        "keys": mine,
        "new_key": new_key,
        "base_url": public_url("/v1", request),
        "a_model": callable_models.models[0] if callable_models.models else "MODEL",
        "why_no_model": callable_models.why_none,
    }
    page = render(request, "portal/keys.html", context)
    # The page may show a new key: no browser or proxy may keep a copy of it.
    add_never_cache_headers(page)
    page["Cache-Control"] = "no-store, no-cache, must-revalidate, private, max-age=0"
    return page


# The keys page counts each key's requests and tokens over this long.
KEY_USE_DAYS = timedelta(days=7)


def key_use(user: Any, *, since: datetime) -> dict[int, dict[str, int]]:
    """Each of ``user``'s keys' requests and tokens since ``since`` (the request log's), by key."""
    from django.db.models import Count, F, Sum

    from gateway.models import RequestLog

    rows = (
        RequestLog.objects.filter(user=user, at__gte=since, key__isnull=False)
        .values("key_id")
        .annotate(requests=Count("pk"), tokens=Sum(F("prompt_tokens") + F("completion_tokens")))
    )
    return {row["key_id"]: {"requests": row["requests"], "tokens": row["tokens"] or 0} for row in rows}


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
    events = [
        FeedEvent(
            pk=r.pk,
            status=r.status,
            start=r.start,
            end=r.end,
            channel=r.channel.name,
            what="whole card" if r.exclusive else (r.model.name if r.model else ""),
            note=r.note,
            created=r.created,
        )
        for r in reservations
    ]
    answer = HttpResponse(feed_ical(events, zone, host), content_type="text/calendar; charset=utf-8")
    answer["ETag"] = etag
    return answer
