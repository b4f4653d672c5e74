"""Who is calling, continued: a key's expiry and scope (docs/api.md, "Keys scoped like a team's
keys"), as pure functions. A key may be limited to models (and so to their aliases) and to
channels; outside them the answer is ``403 key_scope`` naming the scope, and an expired key is
``401 key_expired`` saying when it expired."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from gateway.rules.access import ChannelView, Refusal, models_for, told_at
from gateway.rules.callers import Caller
from slotserve_base.vocabulary import ErrorCode


def expired(caller: Caller, now: datetime) -> Refusal | None:
    if not caller.expired(now):
        return None
    assert caller.expires_at is not None
    when = told_at(caller.expires_at, caller.zone, year=True)
    message = f"this API key expired on {when}: create a new one in the portal"
    return Refusal(401, ErrorCode.KEY_EXPIRED, message)


def reachable(caller: Caller, channels: Sequence[ChannelView]) -> Sequence[ChannelView]:
    """The channels the caller's key may reach (``channels`` themselves for an unscoped key)."""
    allowed = caller.channels_allowed
    return channels if allowed is None else [c for c in channels if c.id in allowed]


def outside(caller: Caller, model: str | None, channel: ChannelView | None) -> Refusal | None:
    """Why the key may not call ``model`` (its real name) or reach ``channel`` (a pinned one),
    or None."""
    models, channels = caller.models_allowed, caller.channels_allowed
    if channel is not None and channels is not None and channel.id not in channels:
        return Refusal(
            403, ErrorCode.KEY_SCOPE, f"this API key may not reach channel {channel.name}: {_scope(caller)}"
        )
    asked = model if model is not None else (channel.model if channel is not None else None)
    if models is not None and asked is not None and asked not in models:
        return Refusal(403, ErrorCode.KEY_SCOPE, f"this API key may not call model {asked}: {_scope(caller)}")
    return None


def _scope(caller: Caller) -> str:
    parts = []
    if caller.models_allowed is not None:
        parts.append("models " + ", ".join(sorted(caller.models_allowed)))
    if caller.channels_allowed is not None:
        names = sorted(caller.channel_names)
        parts.append(
            ("channel " if len(names) == 1 else "channels ") + ", ".join(names)
            if names
            else f"{len(caller.channels_allowed)} channels chosen for it"
        )
    return "it is limited to " + " and ".join(parts)


@dataclass(frozen=True)
class KeyLimits:
    """What a key may do: the models and channels it may reach (None: all) and when it stops
    working (None: never)."""

    models: frozenset[int] | None
    channels: frozenset[int] | None
    expires_at: datetime | None


def beyond(wanted: KeyLimits, limit: KeyLimits) -> str | None:
    """Which limit of a key ``wanted`` would reach past ``limit``'s (``models``, ``channels`` or
    ``expires_at``), or None: a key may make or change keys only within its own scope and
    expiry (docs/api.md), or a leaked narrow key would mint a wide one."""
    if limit.models is not None and (wanted.models is None or not wanted.models <= limit.models):
        return "models"
    if limit.channels is not None and (wanted.channels is None or not wanted.channels <= limit.channels):
        return "channels"
    if limit.expires_at is not None and (wanted.expires_at is None or wanted.expires_at > limit.expires_at):
        return "expires_at"
    return None


class Callable(NamedTuple):
    """The models a person (through a key of this scope) may call now, and, where there is
    none, why, in words for the person."""

    models: list[str]
    why_none: str


def callable_now(
    *,
    caller_id: int,
    channels: Sequence[ChannelView],
    now: datetime,
    models_allowed: frozenset[str] | None = None,
    channels_allowed: frozenset[int] | None = None,
) -> Callable:
    """What the gateway would let the caller call right now, as ``/v1/models`` lists it: the
    portal's snippets name one of these, never a model loaded nowhere or outside the key."""
    loaded = [c for c in channels if c.model is not None]
    if not loaded:
        return Callable([], "no model is loaded on any channel right now")
    usable = models_for(caller_id=caller_id, channels=loaded, now=now)
    if not usable:
        return Callable([], "every model loaded now is on a channel booked by someone else, or still loading")
    in_scope = sorted(
        {
            model
            for model, name in usable
            if (models_allowed is None or model in models_allowed)
            and (channels_allowed is None or any(c.id in channels_allowed for c in loaded if c.name == name))
        }
    )
    if not in_scope:
        return Callable([], "no model this key may call is loaded on a channel you may use now")
    return Callable(in_scope, "")
