"""The overview's channel cards (docs/portal.md): what a card says of a node not ready and of a load
under way, the staff's controls fetched as they are opened, clearing an override."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from channels_app.models import ChannelRuntime, ChannelTarget, Override
from channels_app.scheduling.services import override_set
from reservations.profiles import profile_for
from slotserve_base.vocabulary import Phase
from tests import factories
from tests.clock import PORTAL_T0
from tests.factories import client_for
from tests.test_browser import CHROMIUM, browser, sign_in  # noqa: F401  (browser: a fixture)

HOUR = timedelta(hours=1)


def _card(page: str, name: str) -> str:
    begun = page.index(f'data-channel="{name}"')
    return page[begun : page.index("</section>", begun)]


needs_chromium = pytest.mark.skipif(
    not __import__("pathlib").Path(CHROMIUM).exists(), reason="needs Chromium (apt-get install chromium)"
)


@pytest.mark.django_db(transaction=True)
def test_a_channel_on_a_node_not_ready_says_how_to_start_its_worker_and_what_it_will_run():
    from datetime import timedelta as delta

    from channels_app.models import Node

    staff, member = factories.user("boss", staff=True), factories.user("ana")
    qwen = factories.llm("qwen")
    chat = factories.preset(qwen, "chat", "-c 4096")
    channel = factories.channel("a100-0", default=chat)
    Node.objects.filter(pk=channel.node_id).update(last_heartbeat=timezone.now() - delta(hours=1))
    client = Client()
    client.force_login(staff)
    card = _card(client.get("/").content.decode(), "a100-0")
    assert "node not ready" in card
    assert f"SLOTSERVE_NODE_NAME={channel.node.name} .venv/bin/python manage.py nodeworker" in card
    assert "qwen / chat" in card  # its default, not "—"
    client.force_login(member)
    card = _card(client.get("/").content.decode(), "a100-0")
    assert "node not ready" in card and "manage.py" not in card and "qwen / chat" in card


@pytest.mark.django_db(transaction=True)
def test_a_loading_card_gives_no_estimate_it_does_not_have():
    from channels_app.models import ChannelRuntime, LoadRecord
    from slotserve_base.vocabulary import Phase

    staff = factories.user("boss", staff=True)
    tiny = factories.llm("tiny")
    channel = factories.channel("a100-0")
    now = timezone.now()
    for n in range(3):  # a tiny model: each load took 0.3 s
        began = now - timedelta(hours=n + 1)
        LoadRecord.objects.create(
            channel=channel,
            node=channel.node,
            model=tiny,
            started=began,
            finished=began + timedelta(seconds=0.3),
            succeeded=True,
        )
    ChannelRuntime.objects.create(channel=channel, phase=Phase.LOADING, model=tiny, since=now)
    client = Client()
    client.force_login(staff)
    card = _card(client.get("/").content.decode(), "a100-0")
    assert "0 s" not in card and "loading: under a second so far, usually under a second" in card


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_clearing_an_override_needs_no_until(browser, live_server):  # noqa: F811
    staff = factories.user("boss", staff=True)
    qwen = factories.llm("qwen")
    channel = factories.channel("a100-0")
    ChannelRuntime.objects.create(channel=channel, phase=Phase.READY, model=qwen)
    now = timezone.now()
    override_set(channel=channel, model=qwen, until=now + timedelta(hours=2), now=now, by=staff)
    page = sign_in(browser, live_server, "boss")
    card = page.locator('section.card[data-channel="a100-0"]')
    card.locator("summary", has_text="Channel controls").click()
    card.locator("button", has_text="Clear override").click()
    page.wait_for_selector("text=Override of a100-0 cleared.")
    assert not Override.objects.filter(channel=channel).exists()


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_a_large_labs_overview_fetches_controls_as_opened(browser, live_server, monkeypatch):  # noqa: F811
    """Past a few dozen channels the overview carries no override form per card (200 of them
    made a page of half a megabyte); a card's controls are fetched as they are opened, and work."""
    from portal import views

    monkeypatch.setattr(views, "CONTROLS_INLINE", 1)
    factories.user("boss", staff=True)
    qwen = factories.llm("qwen")
    factories.preset(qwen, "chat")
    for name in ("a100-0", "a100-1"):
        ChannelRuntime.objects.create(channel=factories.channel(name), phase=Phase.READY, model=qwen)
    page = sign_in(browser, live_server, "boss")
    card = page.locator('section.card[data-channel="a100-1"]')
    assert card.locator("form").count() == 0
    card.locator("summary", has_text="Channel controls").click()
    card.locator("select").first.select_option(label="qwen")
    until = (timezone.localtime() + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M")
    card.locator("input[name$='until']").fill(until)
    card.locator("button", has_text="Set override").click()
    page.wait_for_selector("text=Override of a100-1 set.")
    assert Override.objects.get().channel.name == "a100-1"


def test_overview_says_what_runs_and_why(portal, ana):
    ChannelTarget.objects.create(
        channel=portal.channel,
        model=portal.model,
        preset=portal.preset,
        reason="active_reservation",
        valid_until=PORTAL_T0 + HOUR,
        reservation=portal.booked,
    )
    ChannelRuntime.objects.create(
        channel=portal.channel, phase=Phase.READY, model=portal.model, preset=portal.preset
    )
    profile = profile_for(ana)
    profile.time_zone = "Asia/Shanghai"
    profile.save()
    page = client_for(ana).get("/").content.decode()
    assert "a100-0" in page
    assert "gpu-a" in page
    assert "ready" in page
    assert "qwen-7b / chat" in page
    assert "booked by ana until 14:00" in page  # 06:00 UTC in Shanghai
    assert "Channel controls" not in page  # staff only
    partial = client_for(ana).get("/?partial=1").content.decode()
    assert "booked by ana until 14:00" in partial and "<nav>" not in partial


def test_overview_shows_failure_and_fallback(portal, staff):
    ChannelRuntime.objects.create(
        channel=portal.channel,
        phase=Phase.READY,
        model=portal.model,
        preset=portal.preset,
        fallback=True,
        error="CUDA out of memory: lower -ngl or -c",
        retry_at=PORTAL_T0 + timedelta(minutes=2),
    )
    page = client_for(staff).get("/").content.decode()
    assert "CUDA out of memory: lower -ngl or -c" in page
    assert "the default model serves this booking until the retry at 05:02" in page
    assert "Channel controls" in page


def test_a_large_labs_overview_leaves_each_cards_controls_to_be_fetched(portal, staff, ana, monkeypatch):
    from channels_app.models import Channel
    from portal import views

    monkeypatch.setattr(views, "CONTROLS_INLINE", 0)  # the portal's one channel is past it
    page = client_for(staff).get("/").content.decode()
    channel = Channel.objects.order_by("pk").first()
    assert channel is not None
    assert f'data-controls="/channel/{channel.pk}/controls"' in page
    assert "Set override" not in page and "<select" not in page
    controls = client_for(staff).get(f"/channel/{channel.pk}/controls")
    assert controls.status_code == 200 and "Set override" in controls.content.decode()
    assert f'name="ch{channel.pk}-until"' in controls.content.decode()
    assert client_for(ana).get(f"/channel/{channel.pk}/controls").status_code == 302  # staff only
    assert client_for(staff).get("/channel/99999/controls").status_code == 404


def test_staff_sets_an_override_from_the_overview(portal, staff, django_capture_on_commit_callbacks, queued):
    portal.booked.delete()
    with django_capture_on_commit_callbacks(execute=True):
        answer = client_for(staff).post(
            f"/channel/{portal.channel.pk}/override",
            {f"ch{portal.channel.pk}-unload": "on", f"ch{portal.channel.pk}-until": "2026-12-07T07:00"},
        )
    queued.run()
    assert answer.status_code == 302
    assert ChannelTarget.objects.get(channel=portal.channel).reason == "manual_unload"
