"""Creating, finding and revoking API keys."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from datetime import datetime, timedelta, tzinfo
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from channels_app.models import Channel, LLMModel
from gateway.models import ApiKey, hash_key, new_key
from gateway.rules.key_scope import KeyLimits, beyond
from slotserve_base.errors import InvalidInput, OutsideScope
from slotserve_base.happenings import Happening, tell, user_ref
from slotserve_base.iso import iso_moment
from slotserve_base.vocabulary import NotificationEvent, WebhookEvent

# Left out of a call: not given (a new key's default; a change leaves it as it was).
UNCHANGED: Any = object()


def api_key_create(
    *,
    user: User,
    name: str,
    wait_seconds: int = 0,
    models: Iterable[LLMModel] | None = None,
    channels: Iterable[Channel] | None = None,
    expires_at: datetime | None = UNCHANGED,
    read_only: bool = False,
    by_key: ApiKey | None = None,
    now: datetime | None = None,
) -> tuple[ApiKey, str]:
    """A new key for ``user``, limited to ``models`` and ``channels`` when given, until
    ``expires_at``; the plain key is returned once and never stored.

    Asked for with a key (``by_key``, the REST API's caller), it stays within that key's scope
    and expiry: what is not given is that key's, anything wider is ``OutsideScope``."""
    if by_key is not None:
        if models is None:
            models = list(by_key.models_allowed.all())
        if channels is None:
            channels = list(by_key.channels_allowed.all())
        if expires_at is UNCHANGED:
            expires_at = by_key.expires_at
    models, channels = list(models or ()), list(channels or ())
    expires_at = None if expires_at is UNCHANGED else expires_at
    _check_expiry(expires_at, now or timezone.now())
    if by_key is not None:
        _within(by_key, _limits(models, channels, expires_at), "make")
    key = new_key()
    with transaction.atomic():
        api_key = ApiKey.objects.create(
            user=user,
            name=name,
            prefix=key[:10],
            hashed=hash_key(key),
            wait_seconds=wait_seconds,
            expires_at=expires_at,
            read_only=read_only,
        )
        api_key.models_allowed.set(models)
        api_key.channels_allowed.set(channels)
    return api_key, key


def api_key_change(
    *,
    api_key: ApiKey,
    name: str | None = None,
    wait_seconds: int | None = None,
    models: Iterable[LLMModel] | None = None,
    channels: Iterable[Channel] | None = None,
    expires_at: datetime | None = UNCHANGED,
    read_only: bool | None = None,
    by_key: ApiKey | None = None,
    now: datetime | None = None,
) -> ApiKey:
    """Rename a key, change how long the gateway holds its requests by default, its scope
    (an empty list: all), its expiry (None: never) or whether it only reads. Through a key
    (``by_key``), only a key within that key's scope, and only within it."""
    models = list(models) if models is not None else None
    channels = list(channels) if channels is not None else None
    if by_key is not None:
        now_limits = limits_of(api_key)
        _within(by_key, now_limits, "change")
        changed = dataclasses.replace(
            now_limits,
            models=_ids(models) if models is not None else now_limits.models,
            channels=_ids(channels) if channels is not None else now_limits.channels,
            expires_at=api_key.expires_at if expires_at is UNCHANGED else expires_at,
        )
        _within(by_key, changed, "change")
    if expires_at is not UNCHANGED:
        _check_expiry(expires_at, now or timezone.now())
        if expires_at != api_key.expires_at:
            api_key.expiry_told_at = None  # a new expiry is told anew
        api_key.expires_at = expires_at
    if name is not None:
        api_key.name = name
    if wait_seconds is not None:
        api_key.wait_seconds = wait_seconds
    if read_only is not None:
        api_key.read_only = read_only
    with transaction.atomic():
        api_key.save(update_fields=["name", "wait_seconds", "expires_at", "expiry_told_at", "read_only"])
        if models is not None:
            api_key.models_allowed.set(models)
        if channels is not None:
            api_key.channels_allowed.set(channels)
    return api_key


def _ids(objects: list[LLMModel] | list[Channel]) -> frozenset[int] | None:
    return frozenset(o.pk for o in objects) or None


def _limits(models: list[LLMModel], channels: list[Channel], expires_at: datetime | None) -> KeyLimits:
    return KeyLimits(models=_ids(models), channels=_ids(channels), expires_at=expires_at)


def limits_of(api_key: ApiKey) -> KeyLimits:
    return _limits(
        list(api_key.models_allowed.all()), list(api_key.channels_allowed.all()), api_key.expires_at
    )


def _within(by_key: ApiKey, wanted: KeyLimits, doing: str) -> None:
    """``OutsideScope`` naming the caller's limit when ``wanted`` reaches past it."""
    past = beyond(wanted, limits_of(by_key))
    if past is None:
        return
    if past == "models":
        mine = "models " + ", ".join(sorted(m.name for m in by_key.models_allowed.all()))
    elif past == "channels":
        mine = "channels " + ", ".join(sorted(c.name for c in by_key.channels_allowed.all()))
    else:
        assert by_key.expires_at is not None
        mine = f"an expiry of {iso_moment(by_key.expires_at)}"
    raise OutsideScope(
        f"this API key may not {doing} a key beyond its own scope: it is limited to {mine} "
        "(use the portal, or an unscoped key, for a wider one)"
    )


def _check_expiry(expires_at: datetime | None, now: datetime) -> None:
    if expires_at is not None and expires_at <= now:
        raise InvalidInput("expires_at", "a key's expiry must be in the future")


def api_key_found(key: str) -> ApiKey | None:
    """The key (with its active user), expired or not; None for an unknown or revoked key."""
    return ApiKey.objects.live().select_related("user").filter(hashed=hash_key(key)).first()


def api_key_revoke(*, api_key: ApiKey, by_key: ApiKey | None = None) -> None:
    """Revoke ``api_key``; through a key (``by_key``), only one within that key's scope."""
    if by_key is not None:
        _within(by_key, limits_of(api_key), "revoke")
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])


def _expiry_words(api_key: ApiKey, expires: datetime, zone: tzinfo) -> str:
    from reservations.wording import moment_words

    when = moment_words(expires, zone)
    return f"{api_key.user}'s API key {api_key.name} ({api_key.prefix}…) stops working {when}."


# A key's owner is told this long before it stops working.
EXPIRY_NOTICE = timedelta(days=7)


def tell_keys_expiring(*, now: datetime) -> int:
    """Tell the owner of each key that stops working within ``EXPIRY_NOTICE``, once per expiry."""
    from reservations.notifications import notify
    from reservations.wording import expiry_words

    soon = (
        ApiKey.objects.usable(now)
        .filter(expires_at__lte=now + EXPIRY_NOTICE, expiry_told_at__isnull=True)
        .select_related("user")
    )
    told = 0
    for api_key in soon:
        expires = api_key.expires_at
        assert expires is not None

        def text(zone: tzinfo, k: ApiKey = api_key, at: datetime = expires) -> str:
            return (
                f"Your API key {k.name} ({k.prefix}…) expires ({expiry_words(at, zone)}): "
                "create a new one on the keys page, or set a later expiry."
            )

        notify(
            user=api_key.user,
            event=NotificationEvent.KEY_EXPIRING,
            text=text,
            link="/keys/",
            key=f"key_expiring:{api_key.pk}:{expires.isoformat()}",
        )
        tell(
            Happening(
                type=WebhookEvent.KEY_EXPIRING,
                at=now,
                data={
                    "key": {"id": api_key.pk, "name": api_key.name, "prefix": api_key.prefix},
                    "user": user_ref(api_key.user),
                    "expires_at": iso_moment(expires),
                },
                subject=f"key:{api_key.pk}",
                words=functools.partial(_expiry_words, api_key, expires),
                users=frozenset({api_key.user_id}),
                link="/keys/",
            )
        )
        ApiKey.objects.filter(pk=api_key.pk).update(expiry_told_at=now)
        told += 1
    return told
