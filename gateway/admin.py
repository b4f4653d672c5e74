from django.contrib import admin

from gateway.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin[ApiKey]):
    """Keys are created by their owners or ``manage.py apikey``; here they can be revoked."""

    list_display = ["name", "user", "prefix", "created", "last_used", "revoked_at"]
    readonly_fields = ["prefix", "hashed", "created", "last_used"]
    search_fields = ["name", "user__username", "prefix"]

    def has_add_permission(self, request: object) -> bool:
        return False
