"""What every page shows: unread notifications, approvals waiting for staff, the viewer's time zone."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


def navigation(request: HttpRequest) -> dict[str, Any]:
    if not request.user.is_authenticated:
        from django.conf import settings

        # The sign-in page shows the methods that are set up.
        return {
            "oidc_name": settings.SLOTSERVE_OIDC_NAME if settings.SLOTSERVE_OIDC_CLIENT_ID else "",
            "ldap_name": settings.SLOTSERVE_LDAP_NAME if settings.SLOTSERVE_LDAP_URL else "",
        }
    from reservations.models import Notification, ReservationStatus
    from reservations.profiles import profile_for

    profile = profile_for(request.user)
    counts: dict[str, Any] = {
        "unread_count": Notification.objects.filter(user_id=request.user.pk, read=False).count(),
        "profile_zone": profile.time_zone,
        "zone_chosen": profile.time_zone_chosen,
    }
    from reservations.selectors import reviewable_by

    if request.user.is_staff or request.user.approves_for.exists():
        counts["approver"] = True
        counts["approvals_count"] = (
            reviewable_by(request.user).filter(status=ReservationStatus.PENDING).count()
        )
    return counts
