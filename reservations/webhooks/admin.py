"""Staff see every webhook and its delivery log here; owners make and change theirs on the
webhooks page or through the API (the address checks live in the services). Pausing, resuming
and a test event are actions."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from reservations.webhooks.models import WEBHOOK_SHOWN, Delivery, DeliveryTry, Webhook
from reservations.webhooks.services import webhook_pause, webhook_resume, webhook_test
from slotserve_base.errors import TooManyTries


class DeliveryInline(admin.TabularInline[Delivery, Webhook]):
    model = Delivery
    fields = readonly_fields = ("event", "state", "tries", "next_try_at", "delivered_at")
    ordering = ["-pk"]
    extra = 0
    max_num = 0
    show_change_link = True
    can_delete = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Delivery]:
        return super().get_queryset(request).select_related("event")


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin[Webhook]):
    list_display = ["__str__", "owner", "url", "scope", "body", "created", "paused_at"]
    list_filter = ["scope", "body", ("paused_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "url", "owner__username"]
    list_select_related = ["owner"]
    readonly_fields = ["owner", *WEBHOOK_SHOWN]
    exclude = ["secret", "lease_until"]
    inlines = [DeliveryInline]
    actions = ["pause", "resume", "send_test"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Pause the chosen webhooks")
    def pause(self, request: HttpRequest, chosen: QuerySet[Webhook]) -> None:
        for webhook in chosen:
            webhook_pause(webhook=webhook, now=timezone.now())

    @admin.action(description="Resume the chosen webhooks (waiting events go now)")
    def resume(self, request: HttpRequest, chosen: QuerySet[Webhook]) -> None:
        for webhook in chosen:
            webhook_resume(webhook=webhook, now=timezone.now())

    @admin.action(description="Send the chosen webhooks a test event")
    def send_test(self, request: HttpRequest, chosen: QuerySet[Webhook]) -> None:
        for webhook in chosen:
            try:
                webhook_test(webhook=webhook, by=request.user, now=timezone.now())  # type: ignore[arg-type]
            except TooManyTries as refused:
                self.message_user(request, f"{webhook}: {refused.message}", messages.WARNING)


class TryInline(admin.TabularInline[DeliveryTry, Delivery]):
    model = DeliveryTry
    fields = readonly_fields = ("at", "status_code", "duration_ms", "answer", "error")
    extra = 0
    max_num = 0
    can_delete = False


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin[Delivery]):
    list_display = ["event", "webhook", "state", "tries", "next_try_at", "delivered_at"]
    list_filter = ["state", "event__type"]
    search_fields = ["event__msg_id", "webhook__url", "webhook__owner__username"]
    list_select_related = ["event", "webhook"]
    readonly_fields = [
        "webhook",
        "event",
        "body",
        "state",
        "tries",
        "next_try_at",
        "delivered_at",
        "redelivery_of",
    ]
    inlines = [TryInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
