"""A time and a slot in words people read, in the reader's zone with the zone named: ``Tue 8
Dec 2026 10:00 CET``, ``Tue 8 Dec 10:00–12:00 IST`` (every room's messages and pages; the API's
fields stay ISO 8601). The reader's own zone is ``reservations.wording.zone_of``."""

from __future__ import annotations

from datetime import datetime, tzinfo

from django.utils import timezone


def _zone_name(local: datetime) -> str:
    return local.tzname() or "UTC"


def moment_words(moment: datetime, zone: tzinfo | None = None) -> str:
    """``Tue 8 Dec 2026 10:00 CET`` (the year only when it is not this year's)."""
    local = moment.astimezone(zone or timezone.get_current_timezone())
    year = f" {local.year}" if local.year != timezone.now().astimezone(local.tzinfo).year else ""
    return f"{local:%a} {local.day} {local:%b}{year} {local:%H:%M} {_zone_name(local)}"


def slot_words(start: datetime, end: datetime, zone: tzinfo | None = None) -> str:
    """``Tue 8 Dec 10:00–12:00 CET``, or ``Tue 8 Dec 22:00 – Wed 9 Dec 02:00 CET`` across midnight."""
    zone = zone or timezone.get_current_timezone()
    first, last = start.astimezone(zone), end.astimezone(zone)
    if first.date() == last.date() and _zone_name(first) == _zone_name(last):
        return f"{moment_words(start, zone).rsplit(' ', 1)[0]}–{last:%H:%M} {_zone_name(last)}"
    return f"{moment_words(start, zone)} – {moment_words(end, zone)}"


def reader_zone(user: object) -> tzinfo:
    """The zone ``user`` reads times in: their profile's (``reservations.models.Profile``, read
    through the user, so any room may ask), else the active one. An API request's middleware has
    not met its caller yet: its words need this."""
    import zoneinfo

    profile = getattr(user, "profile", None) if getattr(user, "is_authenticated", False) else None
    name = getattr(profile, "time_zone", "") if profile is not None else ""
    try:
        return zoneinfo.ZoneInfo(name) if name else timezone.get_current_timezone()
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return timezone.get_current_timezone()
