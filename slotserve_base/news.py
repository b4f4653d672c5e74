"""News for the gateways: a fact they keep in their snapshot changed (docs/gateway.md, "News of
a change"). Published on the installation's ``news`` Redis channel once the change commits;
each gateway process listening reads its snapshot anew at once instead of within its age limit.
A message lost (Redis away) costs only that: the snapshot's age limit still holds."""

from __future__ import annotations

import logging

from django.db import transaction
from redis.exceptions import RedisError

from slotserve_base.happenings import Happening
from slotserve_base.redis_client import redis_client
from slotserve_base.vocabulary import RedisKey, redis_key

log = logging.getLogger(__name__)

# The happenings that change what a gateway lets in: a booking's slot, who holds it.
BOOKING_NEWS = frozenset(
    {
        "booking.requested",
        "booking.approved",
        "booking.rejected",
        "booking.changed",
        "booking.cancelled",
        "booking.ended_early",
        "booking.released_idle",
    }
)


def news_channel() -> str:
    return redis_key(RedisKey.NEWS, "changed")


def changed(what: str) -> None:
    """Tell the gateways that ``what`` changed, once the current transaction commits (at once
    outside one). Never fails the caller."""

    def publish() -> None:
        try:
            redis_client().publish(news_channel(), what)
        except RedisError:
            log.warning("could not tell the gateways that %s changed", what, exc_info=True)

    transaction.on_commit(publish)


def on_happening(sender: object, happening: Happening, **kwargs: object) -> None:
    """A booking's happening is news for the gateways."""
    if happening.type in BOOKING_NEWS:
        changed(happening.type)
