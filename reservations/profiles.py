"""Each user's profile, made on first use."""

from __future__ import annotations

from typing import Any

from reservations.models import Profile


def profile_for(user: Any) -> Profile:
    profile, _ = Profile.objects.get_or_create(user=user)
    return profile
