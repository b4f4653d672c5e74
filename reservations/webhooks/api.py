"""REST views of the caller's webhooks (``/api/webhooks/``) and their delivery logs
(docs/webhooks.md). Staff see only their own here too; the admin shows everyone's."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, QuerySet
from django.shortcuts import get_object_or_404
from django.utils import timezone
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response

from channels_app.models import Channel
from reservations.webhooks.models import WEBHOOK_SHOWN, Delivery, DeliveryTry, Webhook
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
from slotserve_base.api_fields import IdOrNameField, current_user, reads_only
from slotserve_base.iso import UtcDateTimeField


class WebhookOutput(serializers.ModelSerializer[Webhook]):
    channels = serializers.SerializerMethodField()

    def get_channels(self, webhook: Webhook) -> list[str]:
        return sorted(c.name for c in webhook.channels.all())

    def to_representation(self, webhook: Webhook) -> dict[str, Any]:
        shown = super().to_representation(webhook)
        request = self.context.get("request")
        if request is not None and reads_only(request):
            # A dashboard's key reads webhooks, never the secret that signs their deliveries.
            del shown["secret"]
        return shown

    class Meta:
        model = Webhook
        fields = ["id", "name", "url", "secret", *WEBHOOK_SHOWN[2:]]


class WebhookInput(serializers.Serializer[Any]):
    url = serializers.CharField(max_length=2000, help_text="where deliveries go (http or https)")
    name = serializers.CharField(max_length=100, required=False, allow_blank=True)
    events = serializers.ListField(
        child=serializers.CharField(max_length=40),
        required=False,
        max_length=100,
        help_text="the event types it hears of; empty: every event",
    )
    scope = serializers.CharField(required=False, help_text='"mine" (default) or, for staff, "all"')
    channels = serializers.ListField(
        child=IdOrNameField(queryset=Channel.objects.all()),
        required=False,
        max_length=200,
        help_text='with scope "all": only these channels\' events',
    )
    body = serializers.CharField(required=False, help_text='"standard" (default) or "slack"')


class TryOutput(serializers.ModelSerializer[DeliveryTry]):
    class Meta:
        model = DeliveryTry
        fields = ["at", "status_code", "duration_ms", "answer", "error"]


class DeliveryOutput(serializers.ModelSerializer[Delivery]):
    type = serializers.CharField(source="event.type")
    msg_id = serializers.CharField(source="event.msg_id")
    event_at = UtcDateTimeField(source="event.at")
    attempts = TryOutput(many=True)

    class Meta:
        model = Delivery
        fields = [
            "id",
            "type",
            "msg_id",
            "event_at",
            "state",
            "tries",
            "next_try_at",
            "delivered_at",
            "redelivery_of",
            "body",
            "attempts",
        ]


class DeliveryPages(LimitOffsetPagination):
    default_limit = 50
    max_limit = 500


class WebhookViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet[Webhook],
):
    """The caller's webhooks. ``POST`` makes one (its ``secret`` signs every delivery);
    ``PATCH`` changes what is given; ``…/test`` sends a test event; ``…/deliveries/`` is the
    delivery log with each try; ``…/deliveries/<id>/redeliver`` sends one again."""

    serializer_class = WebhookOutput

    def get_queryset(self) -> QuerySet[Webhook]:
        return Webhook.objects.filter(owner=current_user(self.request)).prefetch_related("channels")

    def create(self, request: Request) -> Response:
        data = WebhookInput(data=request.data)
        data.is_valid(raise_exception=True)
        webhook = webhook_create(owner=current_user(request), **data.validated_data)
        return Response(WebhookOutput(webhook).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        data = WebhookInput(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        webhook = webhook_change(webhook=self.get_object(), **data.validated_data)
        return Response(WebhookOutput(webhook).data)

    def perform_destroy(self, instance: Webhook) -> None:
        webhook_delete(webhook=instance)

    @action(detail=True, methods=["post"])
    def test(self, request: Request, pk: str | None = None) -> Response:
        """Send a ``webhook.test`` event now (paused or not); its try shows in the log."""
        sent = webhook_test(webhook=self.get_object(), by=current_user(request), now=timezone.now())
        return Response(DeliveryOutput(sent).data, status=status.HTTP_202_ACCEPTED)

    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str | None = None) -> Response:
        return Response(WebhookOutput(webhook_pause(webhook=self.get_object(), now=timezone.now())).data)

    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        """Send again; deliveries that waited while it was paused go now, oldest first."""
        return Response(WebhookOutput(webhook_resume(webhook=self.get_object(), now=timezone.now())).data)

    @action(detail=True, methods=["post"], url_path="new-secret")
    def new_secret(self, request: Request, pk: str | None = None) -> Response:
        return Response(WebhookOutput(webhook_new_secret(webhook=self.get_object())).data)

    @action(detail=True, methods=["get"])
    def deliveries(self, request: Request, pk: str | None = None) -> Response:
        """The delivery log, newest first, each delivery with its tries."""
        webhook = self.get_object()
        rows = (
            Delivery.objects.filter(webhook=webhook)
            .select_related("event")
            .prefetch_related(Prefetch("attempts", queryset=DeliveryTry.objects.order_by("at", "pk")))
            .order_by("-pk")
        )
        pages = DeliveryPages()
        page = pages.paginate_queryset(rows, request, view=self)
        return pages.get_paginated_response(DeliveryOutput(page, many=True).data)

    @action(detail=True, methods=["post"], url_path=r"deliveries/(?P<delivery_id>\d+)/redeliver")
    def redeliver(self, request: Request, pk: str | None = None, delivery_id: str = "") -> Response:
        webhook = self.get_object()
        found = get_object_or_404(Delivery, pk=int(delivery_id), webhook=webhook)
        again = delivery_redeliver(delivery=found, now=timezone.now())
        return Response(DeliveryOutput(again).data, status=status.HTTP_202_ACCEPTED)
