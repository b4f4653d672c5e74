"""Creating, finding and revoking API keys."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from gateway.models import ApiKey, hash_key, new_key


def api_key_create(*, user: User, name: str, wait_seconds: int = 0) -> tuple[ApiKey, str]:
    """A new key for ``user``; the plain key is returned once and never stored."""
    key = new_key()
    api_key = ApiKey.objects.create(
        user=user, name=name, prefix=key[:10], hashed=hash_key(key), wait_seconds=wait_seconds
    )
    return api_key, key


def api_key_change(*, api_key: ApiKey, name: str | None = None, wait_seconds: int | None = None) -> ApiKey:
    """Rename a key or change how long the gateway holds its requests by default."""
    if name is not None:
        api_key.name = name
    if wait_seconds is not None:
        api_key.wait_seconds = wait_seconds
    api_key.save(update_fields=["name", "wait_seconds"])
    return api_key


def api_key_user(key: str) -> Any | None:
    """The active user a key belongs to, or None for an unknown or revoked key."""
    found = ApiKey.objects.usable().select_related("user").filter(hashed=hash_key(key)).first()
    return found.user if found is not None else None


def api_key_revoke(*, api_key: ApiKey) -> None:
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
