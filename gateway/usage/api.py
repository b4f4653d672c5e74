"""``GET /api/usage/`` and the numbers every view of usage shows (``report``): one set of numbers
(``gateway.usage.reports``); the portal's page and CSV draw them (``portal/usage.py``)."""

from __future__ import annotations

from datetime import date
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gateway.usage.reports import (
    BY,
    PERIODS,
    NotYours,
    bookings_within,
    period_bounds,
    request_minutes,
    share_rows,
    usage_rows,
)
from gateway.usage.rollups import catching_up
from slotserve_base.iso import iso_moment


def _question(params: Any, viewer: User) -> dict[str, Any]:
    """``by``, ``period`` and ``day`` from a query; a ValueError names what is wrong."""
    by = params.get("by") or "user"
    period = params.get("period") or "week"
    if by not in BY:
        raise ValueError(f"by: use one of {', '.join(BY)}")
    if period not in PERIODS:
        raise ValueError(f"period: use one of {', '.join(PERIODS)}")
    raw = params.get("day")
    try:
        day = date.fromisoformat(raw) if raw else timezone.localdate()
    except ValueError:
        raise ValueError(f"day: {raw!r} is not a date (YYYY-MM-DD)") from None
    if not date(1971, 1, 1) <= day <= date(8999, 1, 1):
        raise ValueError("day: out of range")
    lo, hi = period_bounds(day, period, timezone.get_current_timezone())
    return {"by": by, "period": period, "day": day, "lo": lo, "hi": hi}


def report(params: Any, viewer: User) -> dict[str, Any]:
    """The numbers of one question (``by``, ``period``, ``day``) as ``viewer`` may see them: the
    page, its CSV and the API answer from these."""
    asked = _question(params, viewer)
    lo, hi, now = asked["lo"], asked["hi"], timezone.now()
    touched, held = request_minutes(lo, hi), bookings_within(lo, hi)  # read once for both
    rows = usage_rows(
        by=asked["by"], lo=lo, hi=hi, now=now, viewer=viewer, touched=touched, period_bookings=held
    )
    shares = (
        share_rows(lo=lo, hi=hi, now=now, viewer=viewer, touched=touched, period_bookings=held)
        if viewer.is_staff
        else []
    )
    return {**asked, "rows": rows, "shares": shares, "catching_up": catching_up()}


class UsageView(APIView):
    """``GET /api/usage/?by=user|group|channel|node&period=day|week&day=YYYY-MM-DD``."""

    def get(self, request: Request) -> Response:
        assert isinstance(request.user, User)
        try:
            found = report(request.query_params, request.user)
        except ValueError as problem:
            field, _, words = str(problem).partition(": ")
            raise ValidationError({field: words}) from None
        except NotYours as problem:
            raise PermissionDenied(str(problem)) from None
        return Response(
            {
                "by": found["by"],
                "period": found["period"],
                "from": iso_moment(found["lo"]),
                "to": iso_moment(found["hi"]),
                "rows": found["rows"],
                "shares": found["shares"],
                # How far the request log's backlog is counted (0 to 1), or null: all of it is.
                "catching_up": found["catching_up"],
            }
        )
