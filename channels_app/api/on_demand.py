"""``/api/on-demand-loads/``: the models requests loaded on demand (docs/scheduling.md, "Loaded on
demand"): members see their own, staff everyone's; the one who caused a load, or staff, may
release it before it is idle."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from channels_app.models import OnDemandLoad, OnDemandRelease
from channels_app.scheduling.on_demand import on_demand_release
from slotserve_base.api_fields import UnscopedKeyToChange, current_user


class OnDemandLoadSerializer(serializers.ModelSerializer[OnDemandLoad]):
    channel = serializers.CharField(source="channel.name", read_only=True)
    model = serializers.CharField(source="model.name", read_only=True)
    requested_by = serializers.CharField(source="requested_by.username", default=None, read_only=True)

    class Meta:
        model = OnDemandLoad
        fields = ["id", "channel", "model", "requested_by", "started_at", "released_at", "released_why"]
        read_only_fields = fields


class OnDemandLoadViewSet(viewsets.ReadOnlyModelViewSet[OnDemandLoad]):
    serializer_class = OnDemandLoadSerializer
    permission_classes = [UnscopedKeyToChange]
    filterset_fields = ["released_why"]

    def get_queryset(self) -> QuerySet[OnDemandLoad]:
        loads = OnDemandLoad.objects.select_related("channel", "model", "requested_by")
        user = current_user(self.request)
        return loads if user.is_staff else loads.filter(requested_by=user)

    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk: Any = None) -> Response:
        """Release the load now: its channel goes back to its default."""
        load = self.get_object()
        user = current_user(request)
        if not user.is_staff and load.requested_by_id != user.pk:
            raise PermissionDenied("only the one who loaded it, or staff, may release it")
        released = on_demand_release(load=load, now=timezone.now(), why=OnDemandRelease.STAFF, by=user)
        load.refresh_from_db()
        return Response({**self.get_serializer(load).data, "released_now": released})
