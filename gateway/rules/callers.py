"""Who calls: a key's owner as the gateway's snapshot holds them, with the limits outside their
own slot, their share of a busy channel, their time zone and their key's scope and expiry.
Plain values, read once a second (``gateway.admit.snapshot``) and passed to every stage."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo


@dataclass(frozen=True)
class Limits:
    """What a caller may use outside their own slot (0: no limit), per user and per key."""

    user_concurrent: int = 0
    user_per_minute: int = 0
    user_weekly_tokens: int = 0
    key_concurrent: int = 0
    key_per_minute: int = 0
    key_weekly_tokens: int = 0


@dataclass(frozen=True)
class Caller:
    user_id: int
    username: str
    key_id: int
    wait_seconds: int = 0  # the key's default hold (X-SlotServe-Wait overrides it)
    limits: Limits | None = None  # None: nothing to check
    is_staff: bool = False  # may reach a process's admin endpoints through the pinned path
    weight: int = 1  # the user's share in a channel's fair queue (their groups' largest)
    zone: tzinfo = UTC  # their profile's time zone: refusals tell times in it
    # The key's scope (None: all) and expiry (docs/api.md, "Keys scoped like a team's keys").
    models_allowed: frozenset[str] | None = None  # model names
    channels_allowed: frozenset[int] | None = None
    expires_at: datetime | None = None
    channel_names: frozenset[str] = frozenset()  # the scope's channels, named in its refusals
    loads_on_demand: bool = True  # no group of theirs turned loads on demand off

    @property
    def scoped(self) -> bool:
        return self.models_allowed is not None or self.channels_allowed is not None

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now
