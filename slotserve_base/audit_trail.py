"""Reading the audit trail (docs/architecture.md, "The audit trail"): its filters (``who``,
``what``, ``object``, ``since``, ``until``), each entry as people read it (``row_of``) and
``GET /api/audit/``; staff's page ``/audit/`` and its CSV (``portal/audit.py``) read the same."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import django_filters
from auditlog.models import LogEntry
from django.conf import settings
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db.models import DateTimeField, ForeignKey, Model, OneToOneField, Q, QuerySet
from django.utils import timezone
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


# Related objects by their model and primary key (as the trail keeps it, text), in words.
Names = dict[tuple[type[Model], str], str]


def _related_model(model: type[Model] | None, name: str) -> type[Model] | None:
    """The model the field ``name`` of ``model`` points at, where it points at one object."""
    try:
        field = model._meta.get_field(name) if model else None
    except FieldDoesNotExist:
        return None
    related = field.related_model if isinstance(field, (ForeignKey, OneToOneField)) else None
    return related if isinstance(related, type) else None


def names_of(entries: Iterable[LogEntry]) -> Names:
    """The words of every object the entries' changes point at, read once per kind (a page of
    two hundred entries reads a handful of queries, not one for each name: auditlog's own
    display reads them one at a time)."""
    wanted: dict[type[Model], set[str]] = defaultdict(set)
    for entry in entries:
        model = entry.content_type.model_class() if entry.content_type else None
        for name, change in entry.changes_dict.items():
            related = _related_model(model, name)
            if related is not None and isinstance(change, list):
                wanted[related].update(str(v) for v in change if v not in (None, "None", ""))
    names: Names = {}
    for related, keys in wanted.items():
        pk = related._meta.pk
        found = []
        for key in keys:
            try:
                found.append(pk.to_python(key))
            except ValidationError:
                continue  # kept as words, not a key: shown as it is
        # Their own words may name what they point at (a booking names its channel): joined.
        joined = [f.name for f in related._meta.concrete_fields if isinstance(f, ForeignKey)]
        for obj in related._base_manager.select_related(*joined).filter(pk__in=found):
            names[(related, str(obj.pk))] = str(obj)
    return names


def rows_of(entries: Iterable[LogEntry]) -> list[dict[str, Any]]:
    """``row_of`` for each entry, the related objects' words read together."""
    listed = list(entries)
    names = names_of(listed)
    return [row_of(entry, names) for entry in listed]


def row_of(entry: LogEntry, names: Names | None = None) -> dict[str, Any]:
    """One entry as people read it; ``names``: the related objects' words (``names_of``), read
    for this entry alone when not given."""
    if names is None:
        names = names_of([entry])
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
        "shown": _shown(entry, names),
    }


def _shown(entry: LogEntry, names: Names) -> dict[str, Any]:
    """Each change as people read it: a related object by its name, a choice by its label (the
    raw values, ids and codes, stay in ``changes``)."""
    raw = entry.changes_dict
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
            field = model._meta.get_field(name) if model else None
        except FieldDoesNotExist:  # a field since removed
            field = None
        if isinstance(field, DateTimeField) and isinstance(change, list) and len(change) == 2:
            # Stored as UTC text: shown in the reader's zone (the page's), the zone named.
            shown[name] = [_moment(value) for value in change]
            continue
        shown[name] = (
            _words(field, change, names) if field is not None and isinstance(change, list) else change
        )
    return shown


def _words(field: Any, change: list[Any], names: Names) -> list[Any]:
    """A field's before and after in words, as auditlog's display says them (a choice by its
    label, a long text cut), a related object by ``names``."""
    if isinstance(field, (ForeignKey, OneToOneField)) and isinstance(field.related_model, type):
        related = field.related_model
        return [
            value
            if value in (None, "None", "")
            else names.get((related, str(value)), f"Deleted '{related.__name__}' ({value})")
            for value in change
        ]
    choices = dict(field.flatchoices) if getattr(field, "choices", None) else None
    if not choices and getattr(getattr(field, "base_field", None), "choices", None):
        choices = dict(field.base_field.flatchoices)
    cut = int(getattr(settings, "AUDITLOG_CHANGE_DISPLAY_TRUNCATE_LENGTH", 140))  # auditlog's setting
    said = []
    for value in change:
        if choices:
            said.append(_choice(choices, value))
            continue
        text = str(value) if value is not None else "None"
        said.append(text[:cut] + ("..." if cut > 0 else "") if 0 <= cut < len(text) else text)
    return said


def _choice(choices: dict[Any, Any], value: Any) -> str:
    try:
        parsed = ast.literal_eval(value) if isinstance(value, str) else value
    except (ValueError, SyntaxError):
        parsed = value
    if isinstance(parsed, list):
        return ", ".join(str(choices.get(v, "None")) for v in parsed)
    return str(choices.get(parsed, choices.get(value, "None")))


def _moment(value: Any) -> str:
    """A time as the trail stored it (``str`` of an aware datetime, or "None"), in the current
    zone with the zone's name: ``8 Dec 2026 10:00 CET``."""
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)  # "None", or text the trail kept as it was
    if timezone.is_naive(moment):
        moment = moment.replace(tzinfo=UTC)
    local = timezone.localtime(moment)
    clock = "%H:%M:%S" if local.second else "%H:%M"
    return local.strftime(f"%-d %b %Y {clock} %Z")


class AuditRows(serializers.ListSerializer[LogEntry]):
    """A page of entries, the related objects' words read once for the page (``rows_of``)."""

    def to_representation(self, data: Any) -> list[dict[str, Any]]:
        entries = data.all() if isinstance(data, QuerySet) else data
        return [self.child.to_representation(row) for row in rows_of(entries)]  # type: ignore[union-attr]


class AuditOutput(serializers.Serializer[LogEntry]):
    """One change (``row_of``): who, when, through what, and each field's before and after."""

    class Meta:
        list_serializer_class = AuditRows

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

    def to_representation(self, instance: LogEntry | dict[str, Any]) -> dict[str, Any]:
        row = instance if isinstance(instance, dict) else row_of(instance)
        return dict(super().to_representation(row))


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
