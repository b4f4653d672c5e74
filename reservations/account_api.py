"""REST views of a person's own things: their profile (``/api/me/``), their notifications and
their place on waitlists."""

from __future__ import annotations

import zoneinfo
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from rest_framework import generics, mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from channels_app.models import Channel
from reservations import services
from reservations.filters import NotificationFilter
from reservations.models import Notification, Profile, WaitlistEntry
from reservations.profiles import profile_for
from slotserve_base.api_fields import IdOrNameField, MomentField, current_user
from slotserve_base.public_url import public_url
from slotserve_base.vocabulary import NotificationEvent


class MeOutput(serializers.ModelSerializer[Profile]):
    username = serializers.CharField(source="user.username", read_only=True)
    is_staff = serializers.BooleanField(source="user.is_staff", read_only=True)
    calendar_url = serializers.SerializerMethodField()

    class Meta:
        model = Profile
        fields = [
            "username",
            "is_staff",
            "time_zone",
            "email_events",
            "calendar_url",
            "requests",
            "prompt_tokens",
            "completion_tokens",
        ]
        read_only_fields = ["requests", "prompt_tokens", "completion_tokens"]

    def get_calendar_url(self, profile: Profile) -> str:
        request = self.context["request"]
        return str(public_url(f"/calendar/{profile.calendar_token}.ics", request))

    def validate_time_zone(self, value: str) -> str:
        if value not in zoneinfo.available_timezones():
            raise serializers.ValidationError(f"{value!r} is not an IANA time zone such as 'Asia/Shanghai'")
        return value

    def validate_email_events(self, value: Any) -> dict[str, bool]:
        kinds = set(NotificationEvent.values)
        if not isinstance(value, dict) or not all(
            k in kinds and isinstance(v, bool) for k, v in value.items()
        ):
            raise serializers.ValidationError(f"an object of event kind → true/false; kinds: {sorted(kinds)}")
        return value


class MeView(generics.RetrieveUpdateAPIView[Profile]):
    """``/api/me/``: the caller's time zone, email preferences and calendar feed."""

    serializer_class = MeOutput
    http_method_names = ["get", "patch", "head", "options"]

    def get_object(self) -> Profile:
        return profile_for(current_user(self.request))


class NotificationOutput(serializers.ModelSerializer[Notification]):
    class Meta:
        model = Notification
        fields = ["id", "event", "text", "link", "read", "created"]


class NotificationViewSet(mixins.ListModelMixin, viewsets.GenericViewSet[Notification]):
    serializer_class = NotificationOutput

    filterset_class = NotificationFilter

    def get_queryset(self) -> QuerySet[Notification]:
        return Notification.objects.filter(user=current_user(self.request))

    @action(detail=True, methods=["post"])
    def read(self, request: Request, pk: str | None = None) -> Response:
        notification = self.get_object()
        if not notification.read:
            notification.read = True
            notification.save(update_fields=["read"])
        return Response(NotificationOutput(notification).data)


class WaitlistEntryOutput(serializers.ModelSerializer[WaitlistEntry]):
    channel_name = serializers.CharField(source="channel.name", read_only=True)

    class Meta:
        model = WaitlistEntry
        fields = ["id", "channel", "channel_name", "start", "end", "created", "notified_at"]


class WaitlistInput(serializers.Serializer[Any]):
    channel = IdOrNameField(queryset=Channel.objects.all())
    start = MomentField()
    end = MomentField()


class WaitlistViewSet(
    mixins.ListModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet[WaitlistEntry],
):
    """Your waitlist: slots you asked to be told about when they free. Staff see everyone's."""

    serializer_class = WaitlistEntryOutput

    def get_queryset(self) -> QuerySet[WaitlistEntry]:
        queryset = WaitlistEntry.objects.select_related("channel")
        if not self.request.user.is_staff:
            queryset = queryset.filter(user=current_user(self.request))
        return queryset

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = WaitlistInput(data=request.data)
        data.is_valid(raise_exception=True)
        entry = services.waitlist_join(user=current_user(request), now=timezone.now(), **data.validated_data)
        return Response(WaitlistEntryOutput(entry).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: WaitlistEntry) -> None:
        services.waitlist_leave(entry=instance, by=current_user(self.request))
