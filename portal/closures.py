"""Staff's page of blackouts and bulletins (docs/portal.md, "Blackouts and bulletins"):
close channels for a time with a reason, and say something on everyone's overview."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from portal.actions import me, staff_only
from portal.forms import BlackoutForm, BulletinForm
from reservations.models import Blackout, Bulletin
from reservations.services.blackouts import (
    blackout_create,
    blackout_delete,
    bulletin_create,
    bulletin_delete,
)
from reservations.wording import slot_words
from slotserve_base.errors import InvalidInput

WHAT = "Blackouts and bulletins"


@staff_only(WHAT)
def closures(request: HttpRequest) -> HttpResponse:
    """The page; a POST with ``blackout`` or ``bulletin`` makes one."""
    blackout, bulletin = BlackoutForm(prefix="b"), BulletinForm(prefix="a")
    status = 200
    if request.method == "POST" and "blackout" in request.POST:
        blackout = BlackoutForm(request.POST, prefix="b")
        if blackout.is_valid():
            given = blackout.cleaned_data
            try:
                made, cancelled = blackout_create(by=me(request), now=timezone.now(), **given)
            except InvalidInput as problem:
                blackout.add_error(
                    problem.field if problem.field in blackout.fields else None, problem.message
                )
            else:
                where = ", ".join(c.name for c in made.channels.all()) or "every channel"
                told = f"; {len(cancelled)} booking(s) cancelled, their bookers told why" if cancelled else ""
                messages.success(request, f"{where} closed {slot_words(made.start, made.end)}{told}.")
                return redirect("portal:closures")
        status = 400
    elif request.method == "POST" and "bulletin" in request.POST:
        bulletin = BulletinForm(request.POST, prefix="a")
        if bulletin.is_valid():
            try:
                bulletin_create(by=me(request), now=timezone.now(), **bulletin.cleaned_data)
            except InvalidInput as problem:
                field = problem.field if problem.field in bulletin.fields else None
                bulletin.add_error(field, problem.message)
            else:
                messages.success(request, "Posted: everyone sees it on the overview.")
                return redirect("portal:closures")
        status = 400
    now = timezone.now()
    context = {
        "blackout_form": blackout,
        "bulletin_form": bulletin,
        "blackouts": Blackout.objects.filter(end__gt=now).prefetch_related("channels").order_by("start"),
        "bulletins": Bulletin.objects.exclude(shown_until__lte=now).order_by("shown_from"),
        "now": now,
    }
    return render(request, "portal/closures.html", context, status=status)


@require_POST
@staff_only(WHAT)
def delete_blackout(request: HttpRequest, pk: int) -> HttpResponse:
    blackout = get_object_or_404(Blackout, pk=pk)
    blackout_delete(blackout=blackout, by=me(request))
    messages.success(request, f"Open again: the blackout {slot_words(blackout.start, blackout.end)} is gone.")
    return redirect("portal:closures")


@require_POST
@staff_only(WHAT)
def delete_bulletin(request: HttpRequest, pk: int) -> HttpResponse:
    bulletin_delete(bulletin=get_object_or_404(Bulletin, pk=pk), by=me(request))
    messages.success(request, "The bulletin is taken down.")
    return redirect("portal:closures")
