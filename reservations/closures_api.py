"""``/api/blackouts/`` and ``/api/bulletins/`` (docs/api.md): everyone signed in reads them;
staff make and remove them (``reservations.services.blackouts``)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from channels_app.models import Channel
from reservations.models import BLACKOUT_REASON_MOST, BULLETIN_MOST, Blackout, Bulletin
from reservations.services.blackouts import (
    blackout_create,
    blackout_delete,
    bulletin_create,
    bulletin_delete,
)
from slotserve_base.api_fields import IdOrNameField, MomentField, UnscopedKeyToChange, current_user
from slotserve_base.iso import UtcDateTimeField


class StaffToChange(permissions.BasePermission):
    message = "only staff close channels or post bulletins"

    def has_permission(self, request: Request, view: APIView) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in permissions.SAFE_METHODS or bool(request.user.is_staff)


class BlackoutOutput(serializers.ModelSerializer[Blackout]):
    channels: serializers.Field[Any, Any, Any, Any] = serializers.SlugRelatedField(
        many=True, read_only=True, slug_field="name"
    )
    start = UtcDateTimeField()
    end = UtcDateTimeField()
    created_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        read_only=True, slug_field="username"
    )

    class Meta:
        model = Blackout
        fields = ["id", "channels", "start", "end", "reason", "created_by", "created"]


class BlackoutInput(serializers.Serializer[Any]):
    channels = serializers.ListField(
        child=IdOrNameField(queryset=Channel.objects.all()), required=False, default=list, max_length=1000
    )
    start = MomentField()
    end = MomentField()
    reason = serializers.CharField(max_length=BLACKOUT_REASON_MOST)
    cancel_bookings = serializers.BooleanField(default=False)


class BlackoutViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet[Blackout],
):
    """Times channels are closed, now and later (``?all=1``: the past ones too)."""

    serializer_class = BlackoutOutput
    permission_classes = [StaffToChange, UnscopedKeyToChange]

    def get_queryset(self) -> QuerySet[Blackout]:
        found = Blackout.objects.prefetch_related("channels").select_related("created_by").order_by("start")
        if self.action == "list" and self.request.query_params.get("all") != "1":
            found = found.filter(end__gt=timezone.now())
        return found

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        given = BlackoutInput(data=request.data)
        given.is_valid(raise_exception=True)
        blackout, ended = blackout_create(
            by=current_user(request), now=timezone.now(), **given.validated_data
        )
        answer = {**BlackoutOutput(blackout).data, "cancelled": [r.pk for r in ended]}
        return Response(answer, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: Blackout) -> None:
        blackout_delete(blackout=instance, by=current_user(self.request))


class BulletinOutput(serializers.ModelSerializer[Bulletin]):
    shown_from = UtcDateTimeField()
    shown_until = UtcDateTimeField(allow_null=True)
    created_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        read_only=True, slug_field="username"
    )

    class Meta:
        model = Bulletin
        fields = ["id", "text", "shown_from", "shown_until", "created_by", "created"]


class BulletinInput(serializers.Serializer[Any]):
    text = serializers.CharField(max_length=BULLETIN_MOST)
    shown_from = MomentField(required=False, allow_null=True, default=None)
    shown_until = MomentField(required=False, allow_null=True, default=None)


class BulletinViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet[Bulletin],
):
    """What staff post: shown now and later (staff: also what is over, with ``?all=1``)."""

    serializer_class = BulletinOutput
    permission_classes = [StaffToChange, UnscopedKeyToChange]

    def get_queryset(self) -> QuerySet[Bulletin]:
        found = Bulletin.objects.select_related("created_by").order_by("shown_from")
        if self.action == "list" and self.request.query_params.get("all") != "1":
            found = found.exclude(shown_until__lte=timezone.now())
        if not self.request.user.is_staff:  # members read what is shown, not what is planned
            found = found.filter(shown_from__lte=timezone.now())
        return found

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        given = BulletinInput(data=request.data)
        given.is_valid(raise_exception=True)
        made = bulletin_create(by=current_user(request), now=timezone.now(), **given.validated_data)
        return Response(BulletinOutput(made).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: Bulletin) -> None:
        bulletin_delete(bulletin=instance, by=current_user(self.request))
