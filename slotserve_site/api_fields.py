"""Small pieces shared by the REST API's serializers and views."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import models
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from rest_framework import permissions, serializers
from rest_framework.exceptions import NotAuthenticated
from rest_framework.request import Request
from rest_framework.views import APIView


class IdOrNameField(serializers.PrimaryKeyRelatedField):  # type: ignore[type-arg]
    """A related object given by id (``3``) or by its unique ``name`` (``"a100-0"``)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and not data.isdigit():
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
    if timezone.is_naive(value):
        value = timezone.make_aware(value, timezone.get_current_timezone())
    return value


def current_user(request: Request) -> User:
    """The signed-in user of a request that passed ``IsAuthenticated``."""
    user = request.user
    if not isinstance(user, User):
        raise NotAuthenticated()
    return user
