"""Query filters of the request log (django-filter): ``?user=`` (staff; id or username),
``?channel=`` (id or name), ``?key=`` (id or the first characters a key starts with), ``?model=``,
``?status=``, ``?code=`` (a refusal's), ``?since=`` and ``?until=``."""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet

from gateway.models import RequestLog
from slotserve_base.api_fields import is_id


class RequestLogFilter(django_filters.FilterSet):
    user = django_filters.CharFilter(method="by_user", help_text="user id or username (staff)")
    channel = django_filters.CharFilter(method="by_channel", help_text="channel id or name")
    key = django_filters.CharFilter(method="by_key", help_text="key id, or the characters it starts with")
    model = django_filters.CharFilter(field_name="model")
    status = django_filters.NumberFilter(field_name="status")
    code = django_filters.CharFilter(field_name="error_code", help_text="a refusal's code, e.g. gpu_reserved")
    since = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="lt")

    class Meta:
        model = RequestLog
        fields = ["user", "channel", "key", "model", "status", "code", "since", "until"]

    def by_user(self, queryset: QuerySet[RequestLog], name: str, value: str) -> QuerySet[RequestLog]:
        return queryset.filter(user_id=int(value)) if is_id(value) else queryset.filter(user__username=value)

    def by_channel(self, queryset: QuerySet[RequestLog], name: str, value: str) -> QuerySet[RequestLog]:
        return (
            queryset.filter(channel_id=int(value)) if is_id(value) else queryset.filter(channel__name=value)
        )

    def by_key(self, queryset: QuerySet[RequestLog], name: str, value: str) -> QuerySet[RequestLog]:
        if is_id(value):
            return queryset.filter(key_id=int(value))
        return queryset.filter(key__prefix__startswith=value[:10])
