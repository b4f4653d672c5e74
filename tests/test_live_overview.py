"""The live overview: a change of a channel reaches an open WebSocket within a second."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from channels_app.scheduling.services import decide_channels
from portal.live import OverviewConsumer
from tests import factories
from tests.test_browser import CHROMIUM, browser  # noqa: F401  (browser: a fixture)


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.mark.django_db(transaction=True)
@pytest.mark.anyio
async def test_a_new_target_is_pushed_to_the_overview(memory_layer):
    from asgiref.sync import sync_to_async

    channel, socket = await _watching_a_channel()
    await sync_to_async(decide_channels)(now=timezone.now())
    message = await socket.receive_json_from(timeout=1)
    assert message == {"channels": [channel.pk], "what": "target"}
    await socket.disconnect()


async def _watching_a_channel() -> tuple[Any, WebsocketCommunicator]:
    """A channel with a default, and a signed-in person's overview socket, connected."""
    from asgiref.sync import sync_to_async

    user = await sync_to_async(factories.user)("watcher")
    channel = await sync_to_async(factories.channel)(
        "live-0", default=await sync_to_async(lambda: factories.preset(factories.llm("m"), "p"))()
    )
    socket = WebsocketCommunicator(OverviewConsumer.as_asgi(), "/ws/overview")
    socket.scope["user"] = user
    connected, _ = await socket.connect()
    assert connected
    return channel, socket


@pytest.mark.anyio
async def test_anonymous_visitors_are_turned_away(memory_layer):
    socket = WebsocketCommunicator(OverviewConsumer.as_asgi(), "/ws/overview")
    socket.scope["user"] = AnonymousUser()
    connected, code = await socket.connect()
    assert not connected and code == 4401


@pytest.mark.django_db(transaction=True)
@pytest.mark.anyio
async def test_a_persons_open_pages_hear_their_counts_change(memory_layer):
    """The navigation's badges follow without a reload: a notification for ana reaches her pages
    with her new unread count; a request awaiting approval reaches every approver's with theirs."""
    from asgiref.sync import sync_to_async

    from reservations.services import NewBooking, reservation_create
    from slotserve_base import overview

    ana, boss = (
        await sync_to_async(factories.user)("ana"),
        await sync_to_async(factories.user)("boss", staff=True),
    )
    channel = await sync_to_async(factories.channel)("a100-0", policy="all")
    sockets = {}
    for who in (ana, boss):
        sockets[who.username] = WebsocketCommunicator(OverviewConsumer.as_asgi(), "/ws/overview")
        sockets[who.username].scope["user"] = who
        assert (await sockets[who.username].connect())[0]
    start = timezone.now() + timedelta(days=1)
    await sync_to_async(reservation_create)(
        NewBooking(user=ana, channel=channel, start=start, end=start + timedelta(hours=1), exclusive=True),
        now=timezone.now(),
    )
    told = await sockets["boss"].receive_json_from(timeout=2)
    assert told == {"counts": {"unread": 1, "approvals": 1}}, told  # "ana asks for a100-0…"
    await sync_to_async(overview.deliveries_changed)(ana.pk, 7)
    heard = await sockets["ana"].receive_json_from(timeout=2)
    while "deliveries" not in heard:  # her own counts came first (the request's notification)
        assert heard == {"counts": {"unread": 0}}, heard
        heard = await sockets["ana"].receive_json_from(timeout=2)
    assert heard == {"deliveries": 7}
    for socket in sockets.values():
        await socket.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.anyio
async def test_a_socket_silent_for_30_s_on_the_real_redis_layer_still_receives_a_push(settings):
    """On the Redis channel layer a page's socket waits for pushes in a blocking pop: silent for
    half a minute it stays open (redis-py's own 5 s read timeout once closed it after 5 s, and
    the pushes meanwhile were lost) and hears the next decision."""
    import asyncio
    import copy
    import uuid

    from asgiref.sync import sync_to_async

    # This test's own layer on the real Redis: other tests' pushes (in other workers) are not its.
    layers = copy.deepcopy(settings.CHANNEL_LAYERS)
    assert layers["default"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    layers["default"]["CONFIG"]["prefix"] = f"test-{uuid.uuid4().hex}:layer"
    settings.CHANNEL_LAYERS = layers
    channel_layers.backends.clear()
    try:
        channel, socket = await _watching_a_channel()
        await asyncio.sleep(30)
        assert await socket.receive_nothing(timeout=0.1)  # still open, nothing said
        await sync_to_async(decide_channels)(now=timezone.now())
        message = await socket.receive_json_from(timeout=5)
        assert message == {"channels": [channel.pk], "what": "target"}
        await socket.disconnect()
    finally:
        layer = channel_layers.backends.get("default")
        if layer is not None:
            await layer.close_pools()
        channel_layers.backends.clear()


needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Chromium (apt-get install chromium)"
)


def live_page(chromium: Any, url: str, username: str, path: str) -> Any:
    """``username``'s page at ``path`` on the ASGI server at ``url``, once its live connection is open."""
    from types import SimpleNamespace

    from tests.test_browser import signed_in

    page = signed_in(chromium.new_page(), SimpleNamespace(url=url), username)
    page.goto(f"{url}{path}")
    page.wait_for_function("() => window.slotserveLive && window.slotserveLive.open", timeout=10_000)
    return page


def book_from_another_thread(user: Any, channel: Any) -> None:
    """A pending whole-card booking made from another thread, as a web request or a task makes it
    (Playwright's own event loop runs in the test's)."""
    import threading

    from reservations.services import NewBooking, reservation_create

    start = timezone.now() + timedelta(days=1)
    asked = NewBooking(
        user=user, channel=channel, start=start, end=start + timedelta(hours=1), exclusive=True
    )
    booking = threading.Thread(target=reservation_create, args=(asked,), kwargs={"now": timezone.now()})
    booking.start()
    booking.join()


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_the_badges_count_a_new_request_without_a_reload(browser, settings):  # noqa: F811
    """Served as ``./slotserve start`` serves it (ASGI, WebSockets): a request that awaits
    approval shows in the approver's open page's badges."""

    from slotserve_site.asgi import application
    from tests.conftest import serving

    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
    factories.user("boss", staff=True)
    ana = factories.user("ana")
    channel = factories.channel("a100-0", policy="all")
    with serving(application) as url:
        page = live_page(browser, url, "boss", "/calendar/")
        assert not page.locator("#approvals-count").count()
        book_from_another_thread(ana, channel)
        page.wait_for_selector("#approvals-count:has-text('1')", timeout=10_000)
        page.wait_for_selector("#unread-count:has-text('1')", timeout=10_000)
        assert page.url == f"{url}/calendar/"  # no reload


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_a_webhooks_log_shows_each_try_as_it_is_made_without_a_reload(browser, settings):  # noqa: F811
    """Served as ``./slotserve start`` serves it: a delivery tried while the owner's Webhooks page
    is open shows in its log, with the receiver's answer, and the page is not reloaded."""

    from reservations.webhooks.services import webhook_create
    from slotserve_base.dispatch import webhook_queue
    from slotserve_site.asgi import application
    from tests.conftest import serving
    from tests.queued import worker
    from tests.receiver import Receiver

    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
    settings.SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    ana = factories.user("ana")
    channel = factories.channel("a100-0", policy="all")
    with Receiver(statuses=[202]) as receiver, serving(application) as url, worker(webhook_queue()):
        webhook = webhook_create(owner=ana, url=receiver.url, events=["booking.requested"])
        page = live_page(browser, url, "ana", "/webhooks/")
        page.evaluate("() => { window.stillThisPage = true; }")
        log = page.locator(f"#webhook-{webhook.pk} table.deliveries")
        assert "Nothing sent yet" in log.inner_text()
        book_from_another_thread(ana, channel)
        page.wait_for_selector(f"#webhook-{webhook.pk} table.deliveries div.try", timeout=10_000)
        assert "booking.requested" in log.inner_text() and "202" in log.inner_text()
        assert page.evaluate("() => window.stillThisPage === true")  # no reload
