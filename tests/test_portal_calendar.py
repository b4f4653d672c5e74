"""The calendar and its feed (docs/portal.md): a block's who and what, channels a page at a time for a
large lab, the feed at the public address and in the reader's zone."""

from __future__ import annotations

from datetime import datetime, time, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from reservations.profiles import profile_for
from tests import factories
from tests.clock import T0
from tests.factories import in_zone
from tests.test_browser import CHROMIUM, browser, shot, sign_in  # noqa: F401  (browser: a fixture)

HOUR = timedelta(hours=1)


needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Chromium (apt-get install chromium)"
)


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_a_calendar_block_shows_who_and_what_and_in_full_on_focus(browser, live_server):  # noqa: F811

    ana, bo = factories.user("ana"), factories.user("bo")
    qwen = factories.llm("qwen2.5-7b")
    chat = factories.preset(qwen, "chat")
    channel = factories.channel("a100-0")
    day = (timezone.localtime() + timedelta(days=1)).date()
    at = datetime.combine(day, time(10), tzinfo=timezone.get_current_timezone())
    factories.reservation(owner=ana, on=channel, start=at, end=at + timedelta(hours=2), target=chat)
    factories.reservation(
        owner=bo, on=channel, start=at + timedelta(hours=3), end=at + timedelta(hours=5), target=chat
    )
    page = sign_in(browser, live_server, "ana", width=1366, height=768)
    page.goto(f"{live_server.url}/calendar/?day={day:%Y-%m-%d}")
    mine, theirs = page.locator("button.res.mine"), page.locator("button.res:not(.mine)")

    def shown(block: Any) -> list[str]:
        """Each line of the block, marked if it is cut off."""
        return list(
            block.evaluate(
                "b => [...b.children].map(s => s.textContent"
                " + (s.scrollWidth > s.clientWidth + 1 ? ' (cut)' : ''))"
            )
        )

    assert shown(mine) == ["yours", "qwen2.5-7b"], shown(mine)
    assert shown(theirs) == ["bo", "qwen2.5-7b"], shown(theirs)
    theirs.focus()
    said = page.inner_text("#lane-cursor")
    assert "bo" in said and "qwen2.5-7b / chat" in said and "13:00–15:00" in said, said
    assert "qwen2.5-7b / chat" in (theirs.get_attribute("title") or "")
    shot(page, "calendar-blocks-who-and-what")


@pytest.mark.django_db(transaction=True)
def test_the_calendar_feed_uses_the_public_address(settings):
    settings.SLOTSERVE_PUBLIC_URL = "https://gpu.lab.example"
    ana = factories.user("ana")
    client = Client()
    client.force_login(ana)
    assert "https://gpu.lab.example/calendar/" in client.get("/settings/").content.decode()


@pytest.mark.django_db
def test_the_calendar_feed_speaks_in_the_users_zone(frozen, ana):
    in_zone(ana, "Europe/Berlin")
    chat = factories.preset(factories.llm("qwen"), "chat")
    factories.reservation(
        owner=ana, on=factories.channel("a100-0"), start=T0 + HOUR, end=T0 + 2 * HOUR, target=chat
    )
    body = Client().get(f"/calendar/{profile_for(ana).calendar_token}.ics").content.decode()
    assert "DTSTART;TZID=Europe/Berlin:20261207T100000" in body
    assert "BEGIN:VTIMEZONE" in body and "TZID:Europe/Berlin" in body
    assert "X-WR-TIMEZONE:Europe/Berlin" in body


@pytest.mark.django_db
def test_a_large_labs_calendar_shows_its_channels_a_page_at_a_time(ana):
    """Two hundred channels for a week is a page of a megabyte: the calendar shows 50 channels
    a page, in name order, and its links keep the page, the view and the filters."""
    import re

    from portal.calendar import CALENDAR_CHANNELS

    node = factories.node("big", gpus=60)
    for n in range(60):
        factories.channel(f"ch{n:02d}", on=node, gpu_indexes=[n])
    page = Client()
    page.force_login(ana)
    first = page.get("/calendar/", {"view": "week"}).content.decode()
    shown = re.findall(r'<div class="row" data-channel="([^"]+)"', first)
    assert shown == [f"ch{n:02d}" for n in range(CALENDAR_CHANNELS)] and CALENDAR_CHANNELS == 50
    later = re.search(r'href="\?([^"]*page=2[^"]*)"', first)
    assert later is not None and "view=week" in later.group(1)
    second = page.get("/calendar/?" + later.group(1).replace("&amp;", "&")).content.decode()
    assert re.findall(r'<div class="row" data-channel="([^"]+)"', second) == [
        f"ch{n:02d}" for n in range(50, 60)
    ]
    # Moving a week on keeps the page of channels.
    assert re.search(r'href="\?day=[^"]*view=week[^"]*page=2', second)
    # A filter narrows the channels first: one node's few channels fit one page.
    small = factories.node("small")
    factories.channel("only", on=small)
    filtered = page.get("/calendar/", {"view": "week", "node": small.pk}).content.decode()
    assert re.findall(r'<div class="row" data-channel="([^"]+)"', filtered) == ["only"]
    assert "page=2" not in filtered
