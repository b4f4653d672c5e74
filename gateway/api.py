"""REST views for the caller's own API keys (``/api/keys/``) and the request log
(``/api/requests/``: one's own requests; staff see everyone's)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response

from channels_app.models import Channel, LLMModel
from gateway.api_keys import UNCHANGED, api_key_change, api_key_create, api_key_revoke
from gateway.authentication import calling_key
from gateway.filters import RequestLogFilter
from gateway.models import ApiKey, RequestLog
from slotserve_base.api_fields import IdOrNameField, MomentField, current_user
from slotserve_base.csv_stream import BATCH, csv_response
from slotserve_base.iso import iso_moment


class ApiKeyOutput(serializers.ModelSerializer[ApiKey]):
    models = serializers.SerializerMethodField()
    channels = serializers.SerializerMethodField()

    def get_models(self, key: ApiKey) -> list[str]:
        return sorted(m.name for m in key.models_allowed.all())

    def get_channels(self, key: ApiKey) -> list[str]:
        return sorted(c.name for c in key.channels_allowed.all())

    class Meta:
        model = ApiKey
        fields = [
            "id",
            "name",
            "prefix",
            "created",
            "last_used",
            "revoked_at",
            "wait_seconds",
            "models",
            "channels",
            "expires_at",
            "read_only",
            "max_concurrent",
            "requests_per_minute",
            "weekly_tokens",
        ]


class ApiKeyInput(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=100)
    wait_seconds = serializers.IntegerField(
        min_value=0,
        required=False,
        help_text="seconds the gateway holds this key's requests while their model loads (default 0)",
    )
    models = serializers.ListField(
        child=IdOrNameField(queryset=LLMModel.objects.all()),
        required=False,
        max_length=200,
        help_text="the models (and their aliases) it may call; empty: all",
    )
    channels = serializers.ListField(
        child=IdOrNameField(queryset=Channel.objects.all()),
        required=False,
        max_length=200,
        help_text="the channels it may reach; empty: all",
    )
    expires_at = MomentField(required=False, allow_null=True, help_text="when it stops working; null: never")
    max_concurrent = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=10_000,
        help_text="requests it may have in flight at once; null: none of its own (yours apply)",
    )
    requests_per_minute = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=1_000_000,
        help_text="requests it may start a minute; null: none of its own (yours apply)",
    )
    weekly_tokens = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=10**15,
        help_text="tokens it may use a week outside your own slots; null: none of its own (yours apply)",
    )

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        # Not a class attribute: a serializer's own ``read_only`` is DRF's.
        fields["read_only"] = serializers.BooleanField(
            required=False, help_text="for the REST API: reads only"
        )
        return fields

    def validate_wait_seconds(self, value: int) -> int:
        limit = settings.SLOTSERVE_GATEWAY_MAX_WAIT_SECONDS
        if value > limit:
            raise serializers.ValidationError(f"at most {limit} seconds (SLOTSERVE_GATEWAY_MAX_WAIT_SECONDS)")
        return value


class ApiKeyViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet[ApiKey],
):
    """The caller's keys; the key itself appears only in the answer to ``POST``; ``PATCH``
    renames a key or sets its ``wait_seconds``."""

    serializer_class = ApiKeyOutput

    def get_queryset(self) -> QuerySet[ApiKey]:
        return ApiKey.objects.filter(
            user=current_user(self.request), revoked_at__isnull=True
        ).prefetch_related("models_allowed", "channels_allowed")

    def create(self, request: Request) -> Response:
        data = ApiKeyInput(data=request.data)
        data.is_valid(raise_exception=True)
        given = data.validated_data
        api_key, key = api_key_create(
            user=current_user(request),
            name=given["name"],
            wait_seconds=given.get("wait_seconds", 0),
            models=given.get("models"),
            channels=given.get("channels"),
            expires_at=given.get("expires_at", UNCHANGED),
            read_only=given.get("read_only", False),
            by_key=calling_key(request),
            max_concurrent=given.get("max_concurrent"),
            requests_per_minute=given.get("requests_per_minute"),
            weekly_tokens=given.get("weekly_tokens"),
        )
        return Response({**ApiKeyOutput(api_key).data, "key": key}, status=status.HTTP_201_CREATED)

    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        data = ApiKeyInput(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        api_key = api_key_change(
            api_key=self.get_object(), by_key=calling_key(request), **data.validated_data
        )
        api_key.refresh_from_db()
        return Response(ApiKeyOutput(api_key).data)

    def perform_destroy(self, instance: ApiKey) -> None:
        # Revoked, not deleted: the record shows when a leaked key stopped working.
        api_key_revoke(api_key=instance, by_key=calling_key(self.request))


class RequestLogOutput(serializers.ModelSerializer[RequestLog]):
    user = serializers.CharField(source="user.username")
    key = serializers.CharField(source="key.name", default=None)
    channel = serializers.CharField(source="channel.name", default=None)

    class Meta:
        model = RequestLog
        fields = [
            "id",
            "at",
            "user",
            "key",
            "channel",
            "reservation",
            "model",
            "served_model",
            "method",
            "path",
            "status",
            "ttft_ms",
            "duration_ms",
            "queued_ms",
            "decided_ms",
            "prompt_tokens",
            "completion_tokens",
            "error_code",
            "error",
            "borrowed",
        ]


CSV_FIELDS = RequestLogOutput.Meta.fields
# Where the CSV reads a column the JSON names after a related object.
CSV_SOURCES = {
    "user": "user__username",
    "key": "key__name",
    "channel": "channel__name",
    "reservation": "reservation_id",
}


class RequestPages(LimitOffsetPagination):
    """A log grows without end: pages of 100 unless ``?limit=`` says otherwise (at most 1,000)."""

    default_limit = 100
    max_limit = 1000


class RequestLogViewSet(viewsets.ReadOnlyModelViewSet[RequestLog]):
    """Requests through the gateway, newest first: the caller's own; staff see everyone's and
    may filter by ``user``. ``/api/requests/csv`` gives the same rows (same filters) as CSV."""

    serializer_class = RequestLogOutput
    pagination_class = RequestPages
    filter_backends = [DjangoFilterBackend]
    filterset_class = RequestLogFilter

    def get_queryset(self) -> QuerySet[RequestLog]:
        rows = RequestLog.objects.select_related("user", "key", "channel")
        user = current_user(self.request)
        return rows if user.is_staff else rows.filter(user=user)

    @action(detail=False, methods=["get"], url_path="csv")
    def export(self, request: Request) -> StreamingHttpResponse:
        """The rows as CSV, streamed as they are read (``slotserve_base.csv_stream``): plain
        values, not a serializer per row; times in UTC, as the JSON gives them (``iso_moment``)."""
        rows = self.filter_queryset(self.get_queryset()).values_list(
            *(CSV_SOURCES.get(name, name) for name in CSV_FIELDS)
        )

        def lines() -> Iterator[tuple[Any, ...]]:
            for row in rows.iterator(chunk_size=BATCH):
                yield (row[0], iso_moment(row[1]), *row[2:])

        return csv_response(request._request, CSV_FIELDS, lines(), "slotserve-requests.csv")
