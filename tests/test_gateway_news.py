"""docs/gateway.md, "News of a change": an approval, a revoked key, a channel's new phase reach
every gateway at once (Redis pub/sub), not within its snapshot's age limit."""

from __future__ import annotations

import time
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from gateway.api_keys import api_key_revoke
from gateway.models import ApiKey
from reservations.models import ReservationStatus
from reservations.services.transitions import reservation_approve
from slotserve_base import news
from slotserve_base.redis_client import redis_client
from tests import factories
from tests.clock import eventually

pytestmark = pytest.mark.django_db(transaction=True)

LONG_LIFE = 30  # the snapshot's age limit: nothing here waits for it


def ask(url: str, key: str, model: str = "qwen") -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )


def code(answer: httpx.Response) -> str | None:
    return answer.json().get("error", {}).get("code") if answer.status_code != 200 else None


def until_refused(url: str, key: str, wanted: str, timeout: float = 2.0) -> float:
    """Seconds until the gateway answers ``wanted``; fails past ``timeout``."""
    began = time.perf_counter()
    assert eventually(lambda: code(ask(url, key)) == wanted, timeout=timeout, every=0.005), wanted
    return time.perf_counter() - began


@pytest.fixture
def gateway_url(settings, world):
    from gateway.serve.proxy import Gateway
    from tests.conftest import serving

    settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS = LONG_LIFE
    with serving(Gateway()) as url:
        assert ask(url, world.bo_key).status_code == 200  # the first snapshot, read now
        yield url


def test_an_approval_is_enforced_at_once_not_within_the_snapshots_life(gateway_url, world):
    now = timezone.now()
    booking = factories.reservation(
        owner=world.ana, on=world.channel, start=now - timedelta(minutes=1), end=now + timedelta(hours=1),
        target=None, status=ReservationStatus.PENDING,
    )  # fmt: skip
    booking.exclusive = False
    booking.model = world.model
    booking.save(update_fields=["exclusive", "model"])
    assert ask(gateway_url, world.bo_key).status_code == 200  # a pending booking holds nothing
    reservation_approve(reservation=booking, by=factories.user("boss", staff=True), now=timezone.now())
    took = until_refused(gateway_url, world.bo_key, "gpu_reserved")
    assert took < 1.0, f"the approval took {took:.3f} s to reach the gateway"
    assert ask(gateway_url, world.ana_key).status_code == 200  # the booker is served


def test_a_revoked_key_is_refused_at_once(gateway_url, world):
    api_key_revoke(api_key=ApiKey.objects.get(user=world.bo))
    took = until_refused(gateway_url, world.bo_key, "invalid_api_key")
    assert took < 1.0, f"the revocation took {took:.3f} s to reach the gateway"


def test_without_news_the_snapshot_holds_for_its_life(gateway_url, world):
    """The control: the same change written without news is not seen within the test's time,
    so the two tests above measure the news, not an age limit."""
    ApiKey.objects.filter(user=world.bo).update(revoked_at=timezone.now())
    time.sleep(0.5)
    assert ask(gateway_url, world.bo_key).status_code == 200
    news.changed("key")
    until_refused(gateway_url, world.bo_key, "invalid_api_key")


def test_news_is_published_only_once_its_change_commits(transactional_db):
    from django.db import transaction

    listener = redis_client().pubsub(ignore_subscribe_messages=True)
    listener.subscribe(news.news_channel())
    listener.get_message(timeout=1)
    with transaction.atomic():
        news.changed("target")
        assert listener.get_message(timeout=0.2) is None  # not before the commit
    heard = listener.get_message(timeout=2)
    assert heard is not None and heard["data"] == b"target"

    def rolled_back() -> None:
        with transaction.atomic():
            news.changed("rolled back")
            raise RuntimeError

    with pytest.raises(RuntimeError):
        rolled_back()
    assert listener.get_message(timeout=0.3) is None  # a change rolled back is no news
    listener.close()


def test_a_storm_of_news_is_read_in_a_few_reads(monkeypatch):
    """Every channel of a lab switching at the hour sends hundreds of messages: each gateway
    reads for them no oftener than every NEWS_READ_EVERY, the last read after the last message."""
    import asyncio

    from gateway.admit import snapshot

    reads: list[float] = []

    def read() -> snapshot.Snapshot:
        reads.append(time.monotonic())
        return snapshot.Snapshot(taken_at=reads[-1])

    monkeypatch.setattr(snapshot, "read_snapshot", read)
    cache = snapshot.SnapshotCache(max_age=LONG_LIFE)

    last: list[float] = []

    async def storm() -> float:
        began = time.monotonic()
        for _ in range(100):  # a message every 5 ms for half a second, each heard in turn
            last[:] = [time.monotonic()]
            await cache._heard(last[0])
            await asyncio.sleep(0.005)
        return time.monotonic() - began

    took = asyncio.run(storm())
    assert len(reads) <= took / snapshot.NEWS_READ_EVERY + 2, (len(reads), took)
    assert reads[-1] >= last[0]  # the last message's change is read
