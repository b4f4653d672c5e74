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
