"""Each user's profile, made on first use."""

from __future__ import annotations

from django.contrib.auth.models import User

from reservations.models import Profile


def profile_for(user: User) -> Profile:
    profile, _ = Profile.objects.get_or_create(user=user)
    return profile
