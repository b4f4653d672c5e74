"""The playground (docs/portal.md, "Playground"): chat with a model one may call now, in the
browser, through the gateway as the signed-in person. The page asks for a key of its own
(``gateway.api_keys.playground_key``, an hour's), so every rule of the gateway applies as to
any of the person's keys: their limits, the fair queue, a booker's slot, a model loading."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_POST

from gateway.admit.snapshot import channel_views_now
from gateway.api_keys import playground_key
from gateway.rules.key_scope import callable_now
from portal.actions import me
from slotserve_base.iso import iso_moment


@login_required
def playground(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    callable_models = callable_now(caller_id=me(request).pk, channels=channel_views_now(), now=now)
    chosen = request.GET.get("model", "")
    context = {
        "models": callable_models.models,
        "chosen": chosen if chosen in callable_models.models else "",
        "why_no_model": callable_models.why_none,
    }
    return render(request, "portal/playground.html", context)


@require_POST
@login_required
def key(request: HttpRequest) -> HttpResponse:
    """A key for this sitting, given once to the page's script (never cached)."""
    made, secret = playground_key(user=me(request), now=timezone.now())
    assert made.expires_at is not None
    answer = JsonResponse({"key": secret, "expires": iso_moment(made.expires_at)})
    add_never_cache_headers(answer)
    answer["Cache-Control"] = "no-store, no-cache, must-revalidate, private, max-age=0"
    return answer
