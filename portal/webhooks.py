"""The webhooks page: a user's webhooks, their secrets, a test event, the delivery log with each
try, redelivery (docs/webhooks.md)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_POST

from portal.actions import me
from portal.forms import WebhookForm
from reservations.webhooks.models import Delivery, DeliveryTry, Scope, Webhook
from reservations.webhooks.services import (
    delivery_redeliver,
    webhook_change,
    webhook_create,
    webhook_delete,
    webhook_new_secret,
    webhook_pause,
    webhook_resume,
    webhook_test,
)
from slotserve_base.errors import InvalidInput, TooManyTries

# Deliveries the page shows per webhook (the API pages through all).
SHOWN = 20


@login_required
def webhooks(request: HttpRequest) -> HttpResponse:
    """The page; a POST makes a webhook."""
    if request.method != "POST":
        return _page(request, WebhookForm())
    form = WebhookForm(request.POST)
    if form.is_valid():
        given = form.cleaned_data
        try:
            made = webhook_create(owner=me(request), **_service_arguments(given))
        except InvalidInput as problem:
            form.add_error(_field_of(problem, form), problem.message)
        else:
            messages.success(request, f"Webhook {made} made. Send it a test event to see that it answers.")
            return redirect("portal:webhooks")
    return _page(request, form, status=400)


def _service_arguments(given: dict[str, Any]) -> dict[str, Any]:
    return {
        "url": given["url"],
        "name": given["name"],
        "events": given["events"],
        "body": given["body"],
        "scope": Scope.ALL if given["everyone"] else Scope.MINE,
        "channels": given["channels"],
    }


def _page(
    request: HttpRequest, new: WebhookForm, changing: tuple[int, WebhookForm] | None = None, status: int = 200
) -> HttpResponse:
    """The user's webhooks, each with its change form (the one being changed as it was sent) and
    its last deliveries."""
    mine = list(Webhook.objects.filter(owner=me(request)).prefetch_related("channels"))
    for webhook in mine:
        if changing is not None and changing[0] == webhook.pk:
            webhook.change_form = changing[1]  # type: ignore[attr-defined]
        else:
            webhook.change_form = WebhookForm(prefix=f"w{webhook.pk}", initial=initial_of(webhook))  # type: ignore[attr-defined]
        webhook.shown = list(  # type: ignore[attr-defined]
            Delivery.objects.filter(webhook=webhook)
            .select_related("event")
            .prefetch_related(Prefetch("attempts", queryset=DeliveryTry.objects.order_by("at", "pk")))
            .order_by("-pk")[:SHOWN]
        )
    context = {"form": new, "webhooks": mine, "changing": changing[0] if changing else None}
    page = render(request, "portal/webhooks.html", context, status=status)
    add_never_cache_headers(page)  # it shows secrets
    page["Cache-Control"] = "no-store, no-cache, must-revalidate, private, max-age=0"
    return page


def initial_of(webhook: Webhook) -> dict[str, object]:
    return {
        "url": webhook.url,
        "name": webhook.name,
        "events": webhook.events,
        "body": webhook.body,
        "everyone": webhook.scope == Scope.ALL,
        "channels": list(webhook.channels.all()),
    }


@login_required
@require_POST
def change(request: HttpRequest, pk: int) -> HttpResponse:
    """The webhook's URL, name, events, body and scope, as its card's form gives them."""
    webhook = _mine(request, pk)
    form = WebhookForm(request.POST, prefix=f"w{pk}")
    if form.is_valid():
        try:
            webhook_change(webhook=webhook, **_service_arguments(form.cleaned_data))
        except InvalidInput as problem:
            form.add_error(_field_of(problem, form), problem.message)
        else:
            messages.success(request, f"Webhook {webhook} changed.")
            return redirect("portal:webhooks")
    return _page(request, WebhookForm(), changing=(pk, form), status=400)


def _field_of(problem: InvalidInput, form: WebhookForm) -> str | None:
    if problem.field == "scope":
        return "everyone"
    return problem.field if problem.field in form.fields else None


def _mine(request: HttpRequest, pk: int) -> Webhook:
    return get_object_or_404(Webhook, pk=pk, owner=me(request))


@login_required
@require_POST
def test(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        webhook_test(webhook=_mine(request, pk), by=me(request), now=timezone.now())
    except TooManyTries as refused:
        messages.error(request, refused.message)
    else:
        messages.success(request, "Test event sent; its answer shows in the log below.")
    return redirect("portal:webhooks")


@login_required
@require_POST
def redeliver(request: HttpRequest, pk: int, delivery_id: int) -> HttpResponse:
    found = get_object_or_404(Delivery, pk=delivery_id, webhook=_mine(request, pk))
    try:
        delivery_redeliver(delivery=found, now=timezone.now())
    except TooManyTries as refused:
        messages.error(request, refused.message)
    else:
        messages.success(request, f"{found.event.type} sent again.")
    return redirect("portal:webhooks")


@login_required
@require_POST
def pause(request: HttpRequest, pk: int) -> HttpResponse:
    webhook = _mine(request, pk)
    if webhook.paused_at is None:
        webhook_pause(webhook=webhook, now=timezone.now())
        messages.success(request, f"Webhook {webhook} paused: its events wait until you resume it.")
    else:
        webhook_resume(webhook=webhook, now=timezone.now())
        messages.success(request, f"Webhook {webhook} resumed: the events that waited go now.")
    return redirect("portal:webhooks")


@login_required
@require_POST
def new_secret(request: HttpRequest, pk: int) -> HttpResponse:
    webhook = webhook_new_secret(webhook=_mine(request, pk))
    messages.success(request, f"Webhook {webhook} has a new secret: give it to the receiver.")
    return redirect("portal:webhooks")


@login_required
@require_POST
def delete(request: HttpRequest, pk: int) -> HttpResponse:
    webhook = _mine(request, pk)
    webhook_delete(webhook=webhook)
    messages.success(request, f"Webhook {webhook} deleted.")
    return redirect("portal:webhooks")
