"""Moments as the REST API writes them."""

from __future__ import annotations

from datetime import datetime

from rest_framework import serializers


def iso_moment(moment: datetime) -> str:
    """A moment as the API writes every time (ISO 8601, UTC, as DRF's own fields write it)."""
    return str(serializers.DateTimeField().to_representation(moment))
