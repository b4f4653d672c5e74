"""Reading the audit trail (docs/architecture.md, "The audit trail"): its filters (``who``,
``what``, ``object``, ``since``, ``until``), each entry as people read it (``row_of``) and
``GET /api/audit/``; staff's page ``/audit/`` and its CSV (``portal/audit.py``) read the same."""

from __future__ import annotations

from typing import Any

import django_filters
from auditlog.models import LogEntry
from django.core.exceptions import FieldDoesNotExist
from django.db.models import Q, QuerySet
from rest_framework import permissions, serializers, viewsets
from rest_framework.pagination import LimitOffsetPagination

from slotserve_base.api_fields import UnscopedKeyToRead
from slotserve_base.iso import UtcDateTimeField

# Secrets are recorded as having changed, never their value nor any part of it: the entry keeps
# "(set)" or "(none)" (``slotserve_site.audit.hidden``), and reads as these words.
SECRET_FIELDS = {"password": "password changed", "secret": "new secret"}

ACTIONS = {
    LogEntry.Action.CREATE: "created",
    LogEntry.Action.UPDATE: "changed",
    LogEntry.Action.DELETE: "deleted",
}


class AuditFilter(django_filters.FilterSet):
    who = django_filters.CharFilter(
        method="by_who", help_text="who made the change (username; kept after their account is deleted)"
    )
    what = django_filters.CharFilter(
        field_name="content_type__model", help_text="what kind: channel, override…"
    )
    object = django_filters.CharFilter(
        field_name="object_repr", lookup_expr="icontains", help_text="its name"
    )
    since = django_filters.IsoDateTimeFilter(field_name="timestamp", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="timestamp", lookup_expr="lt")

    class Meta:
        model = LogEntry
        fields = ["who", "what", "object", "since", "until"]

    def by_who(self, queryset: QuerySet[LogEntry], name: str, value: str) -> QuerySet[LogEntry]:
        return queryset.filter(Q(actor__username=value) | Q(additional_data__who=value))


def trail() -> QuerySet[LogEntry]:
    found: QuerySet[LogEntry] = LogEntry.objects.select_related("actor", "content_type").order_by(
        "-timestamp", "-pk"
    )
    return found


def row_of(entry: LogEntry) -> dict[str, Any]:
    extra = entry.additional_data if isinstance(entry.additional_data, dict) else {}
    return {
        "id": entry.pk,
        "at": entry.timestamp,
        # The name kept on the entry: the account may have been deleted since.
        "who": entry.actor.get_username() if entry.actor else str(extra.get("who", "")),
        "email": entry.actor_email or str(extra.get("email", "")),
        "via": extra.get("via", "system"),
        "key": extra.get("key", ""),
        "action": ACTIONS.get(entry.action, str(entry.action)),
        "what": entry.content_type.model if entry.content_type else "",
        "object": entry.object_repr,
        "changes": entry.changes_dict,
        "shown": _shown(entry),
    }


def _shown(entry: LogEntry) -> dict[str, Any]:
    """Each change as people read it: a related object by its name, a choice by its label (the
    raw values, ids and codes, stay in ``changes``)."""
    raw, display = entry.changes_dict, entry.changes_display_dict
    model = entry.content_type.model_class() if entry.content_type else None
    shown: dict[str, Any] = {}
    for name, change in raw.items():
        if isinstance(change, dict) and change.get("type") == "m2m":
            # A many-to-many change: what was added or removed, by name.
            done = "added" if change.get("operation") == "add" else "removed"
            shown[name] = ["", f"{done}: " + ", ".join(str(o) for o in change.get("objects", []))]
            continue
        if name in SECRET_FIELDS and isinstance(change, list) and len(change) == 2:
            # Kept as "(set)" or "(none)", never the value: said in words.
            shown[name] = ["", "removed" if change[1] == "(none)" else SECRET_FIELDS[name]]
            continue
        try:
            # (a relation's other side, or a fact of its own such as a reload, has no label)
            verbose = str(getattr(model._meta.get_field(name), "verbose_name", name)) if model else name
        except FieldDoesNotExist:  # a field since removed
            verbose = name
        shown[name] = display.get(verbose, change)
    return shown


class AuditOutput(serializers.Serializer[LogEntry]):
    """One change (``row_of``): who, when, through what, and each field's before and after."""

    id = serializers.IntegerField()
    at = UtcDateTimeField()
    who = serializers.CharField(help_text="empty for a task or a command; kept after the account is deleted")
    email = serializers.CharField(help_text="who's email when they acted")
    via = serializers.CharField(help_text="portal, api, admin or system")
    key = serializers.CharField(help_text="the API key's name, for a change through the API")
    action = serializers.CharField(help_text="created, changed or deleted")
    what = serializers.CharField(help_text="the kind of object: channel, override, reservation…")
    object = serializers.CharField(help_text="its name")
    changes = serializers.DictField(help_text="each field's [before, after], raw (ids, codes)")
    shown = serializers.DictField(help_text="the same as people read them")

    def to_representation(self, instance: LogEntry) -> dict[str, Any]:
        return dict(super().to_representation(row_of(instance)))


class AuditPages(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1000


class AuditViewSet(viewsets.ReadOnlyModelViewSet[LogEntry]):
    """``GET /api/audit/``: every recorded change, newest first (staff)."""

    serializer_class = AuditOutput
    permission_classes = [permissions.IsAdminUser, UnscopedKeyToRead]
    pagination_class = AuditPages
    filterset_class = AuditFilter
    queryset = trail()

    def get_queryset(self) -> QuerySet[LogEntry]:
        return trail()
