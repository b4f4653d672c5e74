"""What approvers and staff do in the portal: approve and reject bookings, set a channel's
override, reload its process."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from channels_app.models import Channel
from channels_app.scheduling.services import channel_reload, override_clear, override_set
from portal.actions import PAGE, me, reservation_action
from portal.forms import (
    OverrideForm,
)
from reservations import services
from reservations.forms import RejectForm
from reservations.models import Reservation, ReservationStatus
from reservations.selectors import reviewable_by
from reservations.services import InvalidTransition, ReservationConflict
from slotserve_base.api_fields import is_id
from slotserve_base.errors import InvalidInput


def _approver_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Staff, or a group's approver; others answer 403."""

    @login_required
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not (request.user.is_staff or me(request).approves_for.exists()):
            raise PermissionDenied("only staff and group approvers decide bookings")
        return view(request, *args, **kwargs)

    return checked


@_approver_required
def approvals(request: HttpRequest) -> HttpResponse:
    pending = (
        reviewable_by(me(request))
        .filter(status=ReservationStatus.PENDING)
        .select_related("user", "channel", "model", "preset")
    )
    # The nearest first: what must be decided soonest.
    page = Paginator(pending.order_by("start", "pk"), PAGE).get_page(request.GET.get("page"))
    near = _near(list(page))
    rows = [(r, _around(r, near)) for r in page]
    return render(
        request,
        "portal/approvals.html",
        {"pending": page, "rows": rows, "page": page, "reject_form": RejectForm()},
    )


def _near(asked: list[Reservation]) -> list[Reservation]:
    """The bookings on the same channels around the requests asked (a day either side), in one
    query: what an approver weighs a request against."""
    if not asked:
        return []
    lo = min(r.start for r in asked) - timedelta(days=1)
    hi = max(r.end for r in asked) + timedelta(days=1)
    return list(
        Reservation.objects.blocking()
        .filter(channel__in={r.channel_id for r in asked})
        .overlapping(lo, hi)
        .select_related("user")
        .order_by("start")
    )


def _around(asked: Reservation, near: list[Reservation]) -> dict[str, Any]:
    """The booking just before a request on its channel, the one just after, and those it
    overlaps (other requests for the same time)."""
    same = [r for r in near if r.channel_id == asked.channel_id and r.pk != asked.pk]
    before = [r for r in same if r.end <= asked.start]
    after = [r for r in same if r.start >= asked.end]
    return {
        "before": before[-1] if before else None,
        "after": after[0] if after else None,
        "overlapping": [r for r in same if r.start < asked.end and r.end > asked.start],
    }


def _ticked(request: HttpRequest) -> list[int]:
    # Only ASCII digits: "²" and "١" pass isdigit() and fail int().
    return [int(pk) for pk in request.POST.getlist("reservation") if is_id(pk)]


def _decide_ticked(request: HttpRequest, ids: list[int], decide: Any, verb: str, done: str) -> HttpResponse:
    """``decide`` each ticked request the approver may decide (as one at a time would); say how
    many were ``done`` and name those that could not be."""
    chosen = reviewable_by(me(request)).filter(pk__in=ids).select_related("user", "channel")
    decided, refused = 0, []
    for reservation in chosen:
        try:
            decide(reservation)
        except (InvalidInput, InvalidTransition, ReservationConflict) as exc:
            refused.append(f"{reservation.user}'s booking of {reservation.channel}: {exc.message}")
        else:
            decided += 1
    if decided:
        messages.success(request, f"{decided} {done}.")
    for why in refused:
        messages.error(request, why)
    if not decided and not refused:
        messages.error(request, f"Tick the requests to {verb}.")
    return redirect("portal:approvals")


@_approver_required
@require_POST
def approve_several(request: HttpRequest) -> HttpResponse:
    """Approve the ticked requests at once (each as ``approve`` would); those that cannot be
    approved now are named."""

    def approve_one(reservation: Reservation) -> None:
        services.reservation_approve(reservation=reservation, by=me(request), now=timezone.now())

    return _decide_ticked(request, _ticked(request), approve_one, "approve", "approved")


@_approver_required
@require_POST
def reject_several(request: HttpRequest) -> HttpResponse:
    """Reject the ticked requests at once with one reason (each as ``reject`` would); none is
    rejected without a reason."""
    form, ids = RejectForm(request.POST), _ticked(request)
    if ids and not form.is_valid():
        messages.error(request, "Say why the ticked requests are rejected (one reason for all).")
        return redirect("portal:approvals")

    def reject_one(reservation: Reservation) -> None:
        reason = form.cleaned_data["reason"]
        services.reservation_reject(
            reservation=reservation, by=me(request), reason=reason, now=timezone.now()
        )

    return _decide_ticked(request, ids, reject_one, "reject", "rejected")


@_approver_required
@require_POST
def approve(request: HttpRequest, pk: int) -> HttpResponse:
    def act(r: Reservation) -> Reservation:
        return services.reservation_approve(reservation=r, by=me(request), now=timezone.now())

    return reservation_action(
        request, pk, act, "Approved.", back="portal:approvals", among=reviewable_by(me(request))
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
            reservation=r, by=me(request), reason=form.cleaned_data["reason"], now=timezone.now()
        )

    return reservation_action(
        request, pk, act, "Rejected.", back="portal:approvals", among=reviewable_by(me(request))
    )


@staff_member_required
@require_POST
def channel_override(request: HttpRequest, pk: int) -> HttpResponse:
    channel = get_object_or_404(Channel, pk=pk)
    if request.POST.get("clear"):
        override_clear(channel=channel, now=timezone.now(), by=me(request))
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
            by=me(request),
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
    channel_reload(channel=channel, now=timezone.now(), by=me(request))
    messages.success(request, f"{channel} restarts its process now.")
    return redirect("portal:overview")
