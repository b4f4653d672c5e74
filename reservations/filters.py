"""Query filters of the reservation lists (django-filter): ``?channel=`` (id or name),
``?status=``, ``?unread=true`` for notifications."""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet

from reservations.models import Notification, Reservation, ReservationStatus
from slotserve_base.api_fields import is_id


class ReservationFilter(django_filters.FilterSet):
    channel = django_filters.CharFilter(method="by_channel", help_text="channel id or name")
    status = django_filters.ChoiceFilter(choices=ReservationStatus.choices)

    class Meta:
        model = Reservation
        fields = ["channel", "status"]

    def by_channel(self, queryset: QuerySet[Reservation], name: str, value: str) -> QuerySet[Reservation]:
        return (
            queryset.filter(channel_id=int(value)) if is_id(value) else queryset.filter(channel__name=value)
        )


class NotificationFilter(django_filters.FilterSet):
    unread = django_filters.BooleanFilter(method="only_unread")

    class Meta:
        model = Notification
        fields = ["unread"]

    def only_unread(self, queryset: QuerySet[Notification], name: str, value: bool) -> QuerySet[Notification]:
        return queryset.filter(read=False) if value else queryset
