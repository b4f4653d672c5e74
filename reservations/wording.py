"""Times in words people read: in the reader's own zone, with the zone named.

Every message SlotServe writes for a person (notifications, emails, error messages, hints)
says "Tue 8 Dec 10:00–12:00 CET", never ``2026-12-08T09:00:00Z``; the API's fields stay ISO 8601.
"""

from __future__ import annotations

import zoneinfo
from datetime import datetime, timedelta, tzinfo

from django.contrib.auth.models import User
from django.utils import timezone


def zone_of(user: User) -> tzinfo:
    """The user's time zone (their profile's; UTC when it is unknown)."""
    from reservations.profiles import profile_for

    try:
        return zoneinfo.ZoneInfo(profile_for(user).time_zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return zoneinfo.ZoneInfo("UTC")


# The words of a time and a slot are the shared base's, so every room names times alike.
from slotserve_base.time_words import moment_words as moment_words  # noqa: E402
from slotserve_base.time_words import slot_words as slot_words  # noqa: E402


def expiry_words(moment: datetime, zone: tzinfo | None = None) -> str:
    """When a key stops working, as it was asked: ``last day it works: Thu 31 Dec`` for one that
    stops at a midnight of the reader's zone (the portal asks for the last day), else ``works
    until Thu 31 Dec 14:30 CET``."""
    local = moment.astimezone(zone or timezone.get_current_timezone())
    if (local.hour, local.minute, local.second, local.microsecond) == (0, 0, 0, 0):
        day = local - timedelta(days=1)
        year = f" {day.year}" if day.year != timezone.now().astimezone(local.tzinfo).year else ""
        return f"last day it works: {day:%a} {day.day} {day:%b}{year}"
    return f"works until {moment_words(moment, zone)}"
