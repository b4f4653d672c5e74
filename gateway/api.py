"""REST views for the caller's own API keys (``/api/keys/``)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from gateway.models import ApiKey
from gateway.services import api_key_create, api_key_revoke
from slotserve_site.api_fields import current_user


class ApiKeyOutput(serializers.ModelSerializer[ApiKey]):
    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "created", "last_used", "revoked_at"]


class ApiKeyInput(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=100)


class ApiKeyViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet[ApiKey],
):
    """The caller's keys; the key itself appears only in the answer to ``POST``."""

    serializer_class = ApiKeyOutput

    def get_queryset(self) -> QuerySet[ApiKey]:
        return ApiKey.objects.filter(user=current_user(self.request), revoked_at__isnull=True)

    def create(self, request: Request) -> Response:
        data = ApiKeyInput(data=request.data)
        data.is_valid(raise_exception=True)
        api_key, key = api_key_create(user=current_user(request), name=data.validated_data["name"])
        return Response({**ApiKeyOutput(api_key).data, "key": key}, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: ApiKey) -> None:
        # Revoked, not deleted: the record shows when a leaked key stopped working.
        api_key_revoke(api_key=instance)
