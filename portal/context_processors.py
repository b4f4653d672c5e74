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
            "signup_open": settings.SLOTSERVE_SIGNUP != "off",
        }
    from reservations.profiles import profile_for

    profile = profile_for(request.user)
    counted = counts_of(request.user)
    shown: dict[str, Any] = {
        "unread_count": counted["unread"],
        "profile_zone": profile.time_zone,
        "zone_chosen": profile.time_zone_chosen,
    }
    if "approvals" in counted:
        shown["approver"] = True
        shown["approvals_count"] = counted["approvals"]
    return shown


def counts_of(user: Any) -> dict[str, int]:
    """The navigation's counts for ``user``: unread notifications, and for an approver the
    requests awaiting them (``approvals``). The live connection sends the same (``portal.live``)."""
    from reservations.models import Notification, ReservationStatus
    from reservations.selectors import reviewable_by

    counts = {"unread": Notification.objects.filter(user_id=user.pk, read=False).count()}
    if user.is_staff or user.approves_for.exists():
        counts["approvals"] = reviewable_by(user).filter(status=ReservationStatus.PENDING).count()
    return counts
