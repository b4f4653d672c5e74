"""The Django admin as a lab's staff meet it: what they manage (channels, models, presets,
bookings, people, keys, webhooks) first, and what SlotServe keeps for itself (its periodic
jobs, the node workers' runtimes and load records, sign-in lock-outs, deliveries) together
at the end under "Internals", to look at, not to change (docs/portal.md)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.http import HttpRequest

# (app label, model name) of what SlotServe keeps itself; a whole app where the name is "*".
INTERNALS = frozenset(
    {
        ("django_celery_beat", "*"),
        ("axes", "*"),
        ("auditlog", "*"),
        ("channels_app", "channelruntime"),
        ("channels_app", "channeltarget"),
        ("channels_app", "loadrecord"),
        ("channels_app", "reloadrequest"),
        ("webhooks", "delivery"),
    }
)
INTERNALS_NAME = "Internals (kept by SlotServe: look, do not change)"


def internal(app_label: str, model_name: str) -> bool:
    return (app_label, "*") in INTERNALS or (app_label, model_name) in INTERNALS


class SlotServeAdminSite(admin.AdminSite):
    site_header = "SlotServe administration"
    site_title = "SlotServe admin"

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[dict[str, Any]]:
        apps = super().get_app_list(request, app_label)
        if app_label is not None:  # one app's own page: as it is
            return apps
        kept: list[dict[str, Any]] = []
        inside: list[dict[str, Any]] = []
        for app in apps:
            models = [m for m in app["models"] if not internal(app["app_label"], m["object_name"].lower())]
            inside += [
                {**m, "name": f"{m['name']} ({app['name']})"}
                for m in app["models"]
                if internal(app["app_label"], m["object_name"].lower())
            ]
            if models:
                kept.append({**app, "models": models})
        if inside:
            kept.append(
                {
                    "name": INTERNALS_NAME,
                    "app_label": "internals",
                    "app_url": "",
                    "has_module_perms": True,
                    "models": sorted(inside, key=lambda m: str(m["name"])),
                }
            )
        return kept


class SlotServeAdminConfig(AdminConfig):
    default_site = "slotserve_site.admin_site.SlotServeAdminSite"
