"""Small pieces shared by the REST API's serializers and views."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import models
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from rest_framework import permissions, serializers
from rest_framework.exceptions import NotAuthenticated
from rest_framework.request import Request
from rest_framework.views import APIView

from slotserve_base.errors import OutsideScope
from slotserve_base.iso import UtcDateTimeField


class IdOrNameField(serializers.PrimaryKeyRelatedField):  # type: ignore[type-arg]
    """A related object given by id (``3``) or by its unique ``name`` (``"a100-0"``)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and not is_id(data):
            queryset = self.get_queryset()
            assert queryset is not None, "IdOrNameField needs a queryset"
            try:
                return queryset.get(name=data)
            except models.ObjectDoesNotExist:
                self.fail("does_not_exist", pk_value=data)
        return super().to_internal_value(data)


class IsStaffOrReadOnly(permissions.BasePermission):
    message = "only staff may change the inventory"

    def has_permission(self, request: Request, view: APIView) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in permissions.SAFE_METHODS or bool(request.user.is_staff)


def key_scope(request: Request) -> tuple[frozenset[int], frozenset[str]] | None:
    """The channel ids and model names an API key is limited to (docs/api.md, "Keys scoped like a
    team's keys"); None for a signed-in session or an unscoped key."""
    key = request.auth
    if key is None or not hasattr(key, "channels_allowed") or not hasattr(key, "models_allowed"):
        return None
    channels = frozenset(key.channels_allowed.values_list("pk", flat=True))
    models = frozenset(key.models_allowed.values_list("name", flat=True))
    return (channels, models) if channels or models else None


def _scope_words(request: Request) -> str:
    key: Any = request.auth
    channels = sorted(key.channels_allowed.values_list("name", flat=True))
    models = sorted(key.models_allowed.values_list("name", flat=True))
    said = [
        f"channels {', '.join(channels)}" if channels else "",
        f"models {', '.join(models)}" if models else "",
    ]
    return "this API key is limited to " + " and ".join(w for w in said if w)


class ChannelsWithinKeyScope(permissions.BasePermission):
    """A key limited to channels changes only those channels (their settings, override, reload)
    and makes none; a key limited to models only, none. Reading is as for any key."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        if request.method in permissions.SAFE_METHODS or getattr(view, "detail", False):
            return True
        if key_scope(request) is not None:
            raise OutsideScope(f"{_scope_words(request)}: a new channel is outside it")
        return True

    def has_object_permission(self, request: Request, view: APIView, obj: Any) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return True
        scope = key_scope(request)
        if scope is not None and obj.pk not in scope[0]:
            raise OutsideScope(f"{_scope_words(request)}: channel {obj} is outside it")
        return True


class UnscopedKeyToChange(permissions.BasePermission):
    """What every channel shares (nodes, models, presets, aliases) is changed by a signed-in
    session or an unscoped key only: a scoped key's change would reach channels outside it."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        if request.method not in permissions.SAFE_METHODS and key_scope(request) is not None:
            raise OutsideScope(f"{_scope_words(request)}: this changes what every channel shares")
        return True


class UnscopedKeyToRead(permissions.BasePermission):
    """What spans every channel (the audit trail) is read by a session or an unscoped key only."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        if key_scope(request) is not None:
            raise OutsideScope(f"{_scope_words(request)}: the audit trail spans every channel")
        return True


# Times SlotServe takes from users: far enough apart for any booking, and clear of the ends of
# Python's calendar (year 1, year 9999), where adding a load estimate or a week would overflow.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
OUT_OF_RANGE = "times must lie between 1970-01-01 and 9000-01-01"


def in_range(value: datetime) -> bool:
    return EARLIEST <= value < LATEST


class MomentField(UtcDateTimeField):
    """An ISO 8601 time within ``EARLIEST`` and ``LATEST``; outside, a 400 that says so."""

    def to_internal_value(self, value: Any) -> datetime:
        if isinstance(value, str) and len(value) > 64:
            raise serializers.ValidationError("not an ISO 8601 time (too long)")
        moment = super().to_internal_value(value)
        if not in_range(moment):
            raise serializers.ValidationError(OUT_OF_RANGE)
        return moment


def moment_param(request: Request, name: str, default: datetime | None = None) -> datetime:
    """An ISO 8601 time from the query string; a 400 names the parameter."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        if default is None:
            raise serializers.ValidationError({name: "this query parameter is required (ISO 8601 time)"})
        return default
    # A "+" offset arrives as a space when the caller did not URL-encode it.
    try:
        value = parse_datetime(raw.strip().replace(" ", "+"))
    except ValueError:  # well-formed but impossible, e.g. month 13
        value = None
    if value is None:
        raise serializers.ValidationError({name: f"{raw!r} is not an ISO 8601 time"})
    try:
        if timezone.is_naive(value):
            value = timezone.make_aware(value, timezone.get_current_timezone())
        value.astimezone(UTC)
    except (OverflowError, ValueError):
        raise serializers.ValidationError({name: OUT_OF_RANGE}) from None
    if not in_range(value):
        raise serializers.ValidationError({name: OUT_OF_RANGE})
    return value


# The largest id a database row may have (a signed 64-bit integer, PostgreSQL's bigint).
MAX_ID = 2**63 - 1


def is_id(text: str) -> bool:
    """Whether ``text`` is a row's id: ASCII digits only ("²" passes ``str.isdigit`` and fails
    ``int``; "١" is read by ``int`` as 1), within the database's integer (a larger one would
    fail the query, not find nothing)."""
    return text.isascii() and text.isdigit() and int(text) <= MAX_ID


def current_user(request: Request) -> User:
    """The signed-in user of a request that passed ``IsAuthenticated``."""
    user = request.user
    if not isinstance(user, User):
        raise NotAuthenticated()
    return user


def reads_only(request: Request) -> bool:
    """Whether the request came with a read-only API key (a dashboard's): it is shown no secret."""
    return bool(getattr(request.auth, "read_only", False))
