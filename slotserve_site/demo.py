"""What ``./slotserve start --demo`` adds beside its channel: one API key for the admin."""

from __future__ import annotations

from typing import Any


def demo_key(admin: Any) -> str | None:
    """A demo key for ``admin``, made at the first ``--demo`` start (None later: a key is
    shown once, and each start making one would leave a trail of them)."""
    from gateway.api_keys import api_key_create
    from gateway.models import ApiKey

    if ApiKey.objects.filter(user=admin, name="demo", revoked_at__isnull=True).exists():
        return None
    _, key = api_key_create(user=admin, name="demo")
    return str(key)
