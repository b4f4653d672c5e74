from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from gateway.models import ApiKey, RequestLog, SharingLimits


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin[ApiKey]):
    """Keys are created by their owners or ``manage.py apikey``; here they can be revoked, limited
    to models and channels, given an expiry or made read-only."""

    list_display = [
        "name",
        "user",
        "prefix",
        "created",
        "last_used",
        "expires_at",
        "read_only",
        "revoked_at",
        "wait_seconds",
    ]
    readonly_fields = ["prefix", "hashed", "created", "last_used"]
    filter_horizontal = ["models_allowed", "channels_allowed"]
    search_fields = ["name", "user__username", "prefix"]

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change and "expires_at" in form.changed_data:
            obj.expiry_told_at = None  # a new expiry is told anew, as ``api_key_change`` does
        super().save_model(request, obj, form, change)

    def has_add_permission(self, request: object) -> bool:
        return False


@admin.register(RequestLog)
class RequestLogAdmin(admin.ModelAdmin[RequestLog]):
    """The gateway writes the log; here it is read."""

    list_display = ["at", "user", "key", "channel", "model", "path", "status", "ttft_ms", "duration_ms"]
    list_filter = ["status", "channel", "model"]
    search_fields = ["user__username", "model", "path"]
    date_hierarchy = "at"
    list_select_related = ["user", "key", "channel"]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(SharingLimits)
class SharingLimitsAdmin(admin.ModelAdmin[SharingLimits]):
    """One user's own limits outside their slots; empty fields take the SLOTSERVE_LIMIT_* settings."""

    list_display = ["user", "max_concurrent", "requests_per_minute", "weekly_tokens"]
    search_fields = ["user__username"]
    autocomplete_fields = ["user"]
