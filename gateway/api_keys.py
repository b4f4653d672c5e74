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
from slotserve_base import news
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
    playground: bool = False,
    max_concurrent: int | None = None,
    requests_per_minute: int | None = None,
    weekly_tokens: int | None = None,
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
        max_concurrent = _no_looser(by_key, "max_concurrent", max_concurrent, "make")
        requests_per_minute = _no_looser(by_key, "requests_per_minute", requests_per_minute, "make")
        weekly_tokens = _no_looser(by_key, "weekly_tokens", weekly_tokens, "make")
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
            playground=playground,
            max_concurrent=_limit("max_concurrent", max_concurrent),
            requests_per_minute=_limit("requests_per_minute", requests_per_minute),
            weekly_tokens=_limit("weekly_tokens", weekly_tokens),
        )
        api_key.models_allowed.set(models)
        api_key.channels_allowed.set(channels)
        news.changed("key")
    return api_key, key


# How long a playground's key works: a sitting. The page makes another when opened again.
PLAYGROUND_LASTS = timedelta(hours=1)


def playground_key(*, user: User, now: datetime) -> tuple[ApiKey, str]:
    """A key for the portal's playground, its person's own (their limits, scope-free, and their
    bookings apply as to any key of theirs), lasting ``PLAYGROUND_LASTS``. The playground's
    keys that have expired go (the request log keeps their requests, under no key)."""
    ApiKey.objects.filter(user=user, playground=True, expires_at__lte=now).delete()
    return api_key_create(
        user=user, name="Playground", expires_at=now + PLAYGROUND_LASTS, now=now, playground=True
    )


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
    max_concurrent: int | object | None = UNCHANGED,
    requests_per_minute: int | object | None = UNCHANGED,
    weekly_tokens: int | object | None = UNCHANGED,
) -> ApiKey:
    """Rename a key, change how long the gateway holds its requests by default, its scope
    (an empty list: all), its expiry (None: never), whether it only reads, or its own limits
    (None: none of its own). Through a key (``by_key``), only a key within that key's scope,
    and only within it, its limits no looser than that key's."""
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
    own_limits = (
        ("max_concurrent", max_concurrent),
        ("requests_per_minute", requests_per_minute),
        ("weekly_tokens", weekly_tokens),
    )
    for field, value in own_limits:
        if value is not UNCHANGED:
            assert value is None or isinstance(value, int)
            if by_key is not None:
                value = _no_looser(by_key, field, value, "change")
            setattr(api_key, field, _limit(field, value))
    with transaction.atomic():
        api_key.save(
            update_fields=[
                "name",
                "wait_seconds",
                "expires_at",
                "expiry_told_at",
                "read_only",
                "max_concurrent",
                "requests_per_minute",
                "weekly_tokens",
            ]
        )
        if models is not None:
            api_key.models_allowed.set(models)
        if channels is not None:
            api_key.channels_allowed.set(channels)
        news.changed("key")
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


# The words of a key's own limits, for refusals.
LIMIT_WORDS = {
    "max_concurrent": "requests at once",
    "requests_per_minute": "requests a minute",
    "weekly_tokens": "tokens a week",
}


def _limit(field: str, value: int | None) -> int | None:
    """A key's own limit: a whole number of at least 1, or None for none of its own (the
    person's limits still apply to every key of theirs)."""
    if value is not None and value < 1:
        raise InvalidInput(
            field, f"at least 1 ({LIMIT_WORDS[field]}); leave it empty for no limit of its own"
        )
    return value


def _no_looser(by_key: ApiKey, field: str, wanted: int | None, doing: str) -> int | None:
    """Through a key, a key's limit is that key's unless a tighter one is asked for."""
    own = getattr(by_key, field)
    if own is None:
        return wanted
    if wanted is None:
        return int(own)
    if wanted > own:
        raise OutsideScope(
            f"this API key may not {doing} a key with more {LIMIT_WORDS[field]} than its own {own} "
            "(use the portal, or a key without that limit)"
        )
    return wanted


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
        news.changed("key")  # every gateway refuses it at once, not within its snapshot's life


def _expiry_words(api_key: ApiKey, expires: datetime, zone: tzinfo) -> str:
    from reservations.wording import moment_words

    when = moment_words(expires, zone)
    return f"{api_key.user}'s API key {api_key.name} ({api_key.prefix}…) stops working {when}."


# A key's owner is told this long before it stops working.
EXPIRY_NOTICE = timedelta(days=7)


def notice_due(*, created: datetime, expires: datetime, now: datetime) -> bool:
    """Whether the owner should hear now that their key stops working: ``EXPIRY_NOTICE``
    before, or, for a key made to last less than twice that, when half its life is left (a
    key made for five days is no news the day it is made)."""
    return expires - now <= min(EXPIRY_NOTICE, (expires - created) / 2)


def tell_keys_expiring(*, now: datetime) -> int:
    """Tell the owner of each key whose notice is due (``notice_due``), once per expiry."""
    from reservations.notifications import notify
    from reservations.wording import expiry_words

    soon = (
        ApiKey.objects.usable(now)
        .filter(expires_at__lte=now + EXPIRY_NOTICE, expiry_told_at__isnull=True, playground=False)
        .select_related("user")
    )
    told = 0
    for api_key in soon:
        expires = api_key.expires_at
        assert expires is not None
        if not notice_due(created=api_key.created, expires=expires, now=now):
            continue

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
            about=f"{api_key.name} ({api_key.prefix}…)",
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
