"""Moments as the API writes them: ISO 8601 in UTC, ``2026-12-08T09:00:00Z`` (docs/api.md).

Every moment the API, the webhooks and the exports write has this one form, whoever asks and
wherever it is made (a portal session in Berlin, a task in UTC). Times a person reads are words in
their zone (``reservations.wording``); times sent to the API are read as they are written (with
their offset; one without is in the sender's zone)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rest_framework import serializers


def iso_moment(moment: datetime) -> str:
    """``moment`` as the API writes every time: ISO 8601, UTC, ``Z``."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_moment(text: str) -> datetime:
    """A moment ``iso_moment`` wrote, read back."""
    return datetime.fromisoformat(text)


class UtcDateTimeField(serializers.DateTimeField):
    """DRF's date-time field, written in UTC (``iso_moment``) rather than the zone active for the
    request; read as DRF reads it. Every serializer's date-times are this field (``use_utc_moments``)."""

    def to_representation(self, value: Any) -> Any:
        if isinstance(value, datetime) and value.tzinfo is not None:
            return iso_moment(value)
        return super().to_representation(value)


def use_utc_moments() -> None:
    """Make ``UtcDateTimeField`` the field of every model date-time in a ``ModelSerializer``."""
    from django.db import models

    serializers.ModelSerializer.serializer_field_mapping[models.DateTimeField] = UtcDateTimeField
