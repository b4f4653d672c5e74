"""The audit trail (docs/architecture.md, "The audit trail"): every change a person or a key
makes to what a lab runs on, recorded by django-auditlog from the models' own signals, whichever
door it came through. This module says which models and fields are recorded, and tells each
entry who made the change and through what: the portal, the REST API (and the key's name), the
admin; a change with no request behind it (a task, a command) says "system"."""

from __future__ import annotations

import functools
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

        def extra() -> dict[str, str]:
            # Who acted, by name and email, kept on the entry: it outlives their account.
            user = actor()
            who = {"who": user.get_username(), "email": user.email or ""} if user is not None else {}
            return {**via(request), **who}

        context = {"actor": SimpleLazyObject(actor), "additional_data": extra}
        with set_extra_data(context_data=context):
            return self.get_response(request)


def hidden(value: str) -> str:
    """A secret's value as an entry keeps it (django-auditlog's ``mask_callable``): "(set)" or
    "(none)", never any part of it; read as words (``slotserve_base.audit_trail.SECRET_FIELDS``)."""
    return "(none)" if value in ("", "None") or value.startswith("!") else "(set)"


# What is recorded: the settings people change, not what the system keeps moving (heartbeats,
# phases, counters); secrets as changed, never their values or hashes.
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
        "include_fields": [
            "owner",
            "name",
            "url",
            "events",
            "scope",
            "body",
            "paused_at",
            "paused_reason",
            "secret",
        ],
        "mask_fields": ["secret"],
        "m2m_fields": {"channels"},
    },
    "gateway.SharingLimits": {
        "include_fields": ["user", "max_concurrent", "requests_per_minute", "weekly_tokens"]
    },
    "gateway.ApiKey": {
        "include_fields": [
            "user",
            "name",
            "prefix",
            "revoked_at",
            "max_concurrent",
            "requests_per_minute",
            "weekly_tokens",
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
            "password",
        ],
        "mask_fields": ["password"],
        "m2m_fields": {"groups", "user_permissions"},
    },
    "auth.Group": {"include_fields": ["name"], "m2m_fields": {"permissions"}},
    "reservations.Blackout": {"include_fields": ["start", "end", "reason"], "m2m_fields": {"channels"}},
    "reservations.Bulletin": {"include_fields": ["text", "shown_from", "shown_until"]},
    "reservations.Invitation": {
        "include_fields": ["email", "expires_at", "accepted_by", "accepted_at"],
        "m2m_fields": {"groups"},
    },
    "reservations.SignupRequest": {
        "include_fields": ["user", "email_confirmed_at", "decided_at", "decided_by"]
    },
}


def register_audited() -> None:
    from auditlog.registry import auditlog
    from django.apps import apps
    from django.db.models.signals import m2m_changed

    for label, options in AUDITED.items():
        model = apps.get_model(label)
        if not auditlog.contains(model):
            # Many-to-many changes are recorded here (``_m2m_changed``), not by django-auditlog,
            # which records a ``clear()`` as every object of the related model.
            m2m = options.get("m2m_fields", set())
            mask = {"mask_callable": "slotserve_site.audit.hidden"} if options.get("mask_fields") else {}
            auditlog.register(model, **{k: v for k, v in options.items() if k != "m2m_fields"}, **mask)
            for name in m2m:
                m2m_changed.connect(
                    functools.partial(_m2m_changed, name),
                    sender=getattr(model, name).through,
                    weak=False,
                    dispatch_uid=f"slotserve-audit-{label}-{name}",
                )


def _m2m_changed(
    name: str, sender: Any, instance: Any, action: str, reverse: bool, model: Any, pk_set: Any, **_: Any
) -> None:
    """A many-to-many change, recorded on the object that owns the field as what was added or
    removed, by name: from either side (``ana.groups.add(lab)`` or ``lab.user_set.add(ana)``),
    and a ``clear()`` as what it held."""
    from auditlog.models import LogEntry

    if action == "pre_clear":
        # What is about to go: the related objects (forward), or the owners (reverse).
        held = (
            list(model.objects.filter(**{name: instance})) if reverse else list(getattr(instance, name).all())
        )
        instance._audit_cleared = held
        return
    if action not in ("post_add", "post_remove", "post_clear"):
        return
    operation = "add" if action == "post_add" else "delete"
    if action == "post_clear":
        changed = instance.__dict__.pop("_audit_cleared", [])
    else:
        changed = list(model.objects.filter(pk__in=pk_set or ()))
    if not reverse:
        LogEntry.objects.log_m2m_changes(changed, instance, operation, name)
        return
    for owner in changed:  # the forward objects whose field changed
        LogEntry.objects.log_m2m_changes([instance], owner, operation, name)
