"""Each user's profile, made on first use, and the writes to it."""

from __future__ import annotations

import zoneinfo

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from reservations.models import Profile
from slotserve_base.errors import InvalidInput


def profile_for(user: User) -> Profile:
    profile, _ = Profile.objects.get_or_create(user=user)
    return profile


def valid_zone(name: str) -> str:
    """The IANA zone ``name``; ``InvalidInput`` (a 400) naming it when there is no such zone."""
    if name not in zoneinfo.available_timezones():
        raise InvalidInput("time_zone", f"{name!r} is not a time zone (use a name like Europe/Berlin)")
    return name


def profile_set_time_zone(user: User, name: str, *, detected: bool = False) -> bool:
    """Set the user's time zone; whether it changed. A zone ``detected`` from the browser is
    taken only while the user has not chosen one: it never overrides a choice."""
    zone = valid_zone(name)
    profile = profile_for(user)
    if detected and profile.time_zone_chosen:
        return False
    changed = profile.time_zone != zone
    profile.time_zone, profile.time_zone_chosen = zone, True
    profile.save(update_fields=["time_zone", "time_zone_chosen"])
    return changed


def user_set_email(user: User, email: str) -> None:
    """Where SlotServe's emails to ``user`` go (empty: nowhere); a malformed address is refused
    by name and nothing is saved."""
    email = email.strip()
    if email:
        try:
            validate_email(email)
        except ValidationError as problem:
            raise InvalidInput("email", f"{email!r} is not an email address") from problem
    if user.email != email:
        user.email = email
        user.save(update_fields=["email"])


def profile_set_week_start(user: User, weekday: int) -> None:
    """The day ``user``'s calendar week begins on (0 Monday … 6 Sunday)."""
    if weekday not in range(7):
        raise InvalidInput("week_start", f"{weekday} is not a day of the week (0 Monday … 6 Sunday)")
    profile = profile_for(user)
    if profile.week_start != weekday:
        profile.week_start = weekday
        profile.save(update_fields=["week_start"])
