"""Counts in the navigation: unread notifications, and approvals waiting for staff."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


def navigation(request: HttpRequest) -> dict[str, Any]:
    if not request.user.is_authenticated:
        return {}
    from reservations.models import Notification, Reservation, ReservationStatus

    counts: dict[str, Any] = {
        "unread_count": Notification.objects.filter(user_id=request.user.pk, read=False).count()
    }
    if request.user.is_staff:
        counts["approvals_count"] = Reservation.objects.filter(status=ReservationStatus.PENDING).count()
    return counts
