"""The audit trail (docs/architecture.md, "The audit trail"): every change a person or a key
makes to what a lab runs on, recorded by django-auditlog from the models' own signals, whichever
door it came through. This module says which models and fields are recorded, and tells each
entry who made the change and through what: the portal, the REST API (and the key's name), the
admin; a change with no request behind it (a task, a command) says "system"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from auditlog.context import set_extra_data
from django.http import HttpRequest, HttpResponse
from django.utils.functional import SimpleLazyObject

from channels_app.models.channel import CHANNEL_SETTINGS


def via(request: HttpRequest) -> dict[str, str]:
    """Through what a request changes things, read when an entry is written (an API key's user
    is known only once the REST API has authenticated it)."""
    if request.path.startswith("/admin/"):
        return {"via": "admin"}
    if request.path.startswith("/api/"):
        key = getattr(getattr(request, "auth", None), "name", None)  # the REST API sets the key it took
        return {"via": "api", **({"key": str(key)} if key else {})}
    return {"via": "portal"}


class AuditMiddleware:
    """django-auditlog's middleware, with the actor read when an entry is written rather than
    when the request arrives: the REST API authenticates a key inside the view."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        def actor() -> Any:
            user = getattr(request, "user", None)
            return user if user is not None and user.is_authenticated else None

        context = {"actor": SimpleLazyObject(actor), "additional_data": lambda: via(request)}
        with set_extra_data(context_data=context):
            return self.get_response(request)


# What is recorded: the settings people change, not what the system keeps moving (heartbeats,
# phases, counters, hashes of secrets).
AUDITED: dict[str, dict[str, Any]] = {
    "channels_app.Channel": {
        "include_fields": [f for f in CHANNEL_SETTINGS if f != "allowed_groups"],
        "m2m_fields": {"allowed_groups"},
    },
    "channels_app.LLMModel": {
        "include_fields": ["name", "backend", "path", "size_bytes", "labels", "placement_strategy"],
        "m2m_fields": {"nodes"},
    },
    "channels_app.Preset": {"include_fields": ["model", "name", "args", "places"]},
    "channels_app.ModelAlias": {"include_fields": ["name", "model"]},
    "channels_app.Node": {"include_fields": ["name", "address", "labels"]},
    "channels_app.Gpu": {"include_fields": ["index", "name", "memory_bytes"]},
    "channels_app.Override": {"include_fields": ["channel", "model", "preset", "unload", "until"]},
    "reservations.Reservation": {
        "include_fields": [
            "lend",
            "status",
            "start",
            "end",
            "channel",
            "model",
            "preset",
            "exclusive",
            "reject_reason",
        ]
    },
    "reservations.GroupPolicy": {"include_fields": ["group", "share_weight"], "m2m_fields": {"approvers"}},
    "webhooks.Webhook": {
        "include_fields": ["owner", "name", "url", "events", "scope", "body", "paused_at", "paused_reason"],
        "m2m_fields": {"channels"},
    },
    "gateway.ApiKey": {
        "include_fields": [
            "user",
            "name",
            "prefix",
            "revoked_at",
            "max_concurrent",
            "requests_per_minute",
            "expires_at",
            "read_only",
            "wait_seconds",
        ],
        "m2m_fields": {"models_allowed", "channels_allowed"},
    },
    "auth.User": {
        "include_fields": [
            "username",
            "email",
            "first_name",
            "last_name",
            "is_active",
            "is_staff",
            "is_superuser",
        ],
        "m2m_fields": {"groups"},
    },
    "auth.Group": {"include_fields": ["name"]},
}


def register_audited() -> None:
    from auditlog.registry import auditlog
    from django.apps import apps

    for label, options in AUDITED.items():
        model = apps.get_model(label)
        if not auditlog.contains(model):
            auditlog.register(model, **options)
