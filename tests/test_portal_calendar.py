"""The calendar and its feed (docs/portal.md): a block's who and what, channels a page at a time for a
large lab, the feed at the public address and in the reader's zone."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from reservations.models import Reservation
from reservations.profiles import profile_for
from tests import factories
from tests.clock import PORTAL_T0, T0
from tests.factories import client_for, in_zone
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


def test_calendar_shows_reservations_pending_and_preloads(portal, ana, bo):
    portal.channel.approval_policy = "all"
    portal.channel.save()
    factories.reservation(
        owner=bo,
        on=portal.channel,
        start=PORTAL_T0 + 3 * HOUR,
        end=PORTAL_T0 + 4 * HOUR,
        target=portal.preset,
        status="pending",
    )
    other = factories.preset(portal.other_model, "b2")
    factories.reservation(
        owner=bo, on=portal.channel, start=PORTAL_T0 + HOUR, end=PORTAL_T0 + 2 * HOUR, target=other
    )
    page = client_for(ana).get("/calendar/", {"day": "2026-12-07"}).content.decode()
    assert '<span class="who">yours</span><span class="what">qwen-7b</span>' in page
    assert 'title="ana, Mon 7 Dec' in page and 'qwen-7b / chat"' in page
    assert "res approved mine" in page
    assert "res pending" in page and "(pending approval)" in page
    # bo's 70B model follows ana's booking directly: its loading eats into bo's slot.
    assert 'class="lost"' in page and "min lost to loading" in page
    assert 'class="now"' in page
    week = client_for(ana).get("/calendar/", {"day": "2026-12-09", "view": "week"})
    text = week.content.decode()
    assert week.status_code == 200 and "week of Mon 7 Dec 2026" in text
    # A lane a day, each 24 hours wide: Monday's bookings sit in Monday's lane, readable.
    labels = [part.split("</div>")[0] for part in text.split('<div class="lane-label">')[1:]]
    assert labels == ["Mon 07", "Tue 08", "Wed 09", "Thu 10", "Fri 11", "Sat 12", "Sun 13"]
    monday = text.split('<div class="lane-label">Mon 07</div>')[1].split(
        '<div class="lane-label">Tue 08</div>'
    )[0]
    assert '<span class="who">yours</span><span class="what">qwen-7b</span>' in monday
    assert '<span class="who">pending: bo</span><span class="what">qwen-7b</span>' in monday
    assert 'data-origin="2026-12-07T00:00:00+' in monday or 'data-origin="2026-12-07T00:00:00-' in monday


def test_calendar_feed(portal, ana, bo):
    token = profile_for(ana).calendar_token
    answer = Client().get(f"/calendar/{token}.ics")
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/calendar")
    body = answer.content.decode()
    assert "BEGIN:VEVENT" in body and "a100-0: qwen-7b" in body
    assert "DTSTART:20261207T040000Z" in body
    assert Client().get("/calendar/not-a-token.ics").status_code == 404
    assert (
        "BEGIN:VEVENT" not in Client().get(f"/calendar/{profile_for(bo).calendar_token}.ics").content.decode()
    )


@pytest.mark.parametrize(
    "zone", ["Europe/Berlin", "America/New_York", "UTC", "Asia/Kolkata", "Australia/Lord_Howe"]
)
def test_the_feed_kept_booking_by_booking_is_what_icalendar_writes_whole(zone):
    """Each booking's VEVENT is kept and the feed assembled from them: byte for byte the
    calendar icalendar writes whole (its VTIMEZONE first, none for UTC), notes, pending and
    whole-card bookings included; and a booking that changed is written anew."""
    from zoneinfo import ZoneInfo

    from portal.feed import FeedEvent, feed_ical, whole_calendar

    tz = ZoneInfo(zone)
    t0 = datetime(2026, 3, 28, 22, tzinfo=UTC)  # across Europe's change to summer time
    day = timedelta(days=1)
    note = "eval run; a long note, with a comma, that icalendar folds at seventy-five octets"
    events = [
        FeedEvent(1, "approved", t0, t0 + timedelta(hours=5), "a100-0", "qwen-7b", "", t0 - 2 * day),
        FeedEvent(2, "pending", t0 + day, t0 + day + timedelta(hours=2), "a100-1", "whole card", note, t0),
        FeedEvent(
            3,
            "approved",
            t0 + 2 * day,
            t0 + 2 * day + timedelta(minutes=90),
            'gpu;1, "east"',
            "llama-3.1 8B-instruct, q4",
            "line one\nline two\r\nback\\slash; a literal \\N; ünïcödé\r" * 4,
            t0.replace(microsecond=123456),
        ),
    ]
    assert feed_ical(events, tz, "lab.example") == whole_calendar(events, tz, "lab.example").to_ical()
    assert feed_ical([], tz, "lab.example") == whole_calendar([], tz, "lab.example").to_ical()
    moved = [events[0], FeedEvent(**{**events[1].__dict__, "end": t0 + timedelta(days=1, hours=3)})]
    assert feed_ical(moved, tz, "lab.example") == whole_calendar(moved, tz, "lab.example").to_ical()
    assert feed_ical(moved, tz, "lab.example") != feed_ical(events, tz, "lab.example")


def test_a_calendar_program_that_fetches_again_gets_304_until_a_booking_changes(portal, ana):

    token = profile_for(ana).calendar_token
    first = Client().get(f"/calendar/{token}.ics")
    assert first.status_code == 200 and first["ETag"]
    again = Client().get(f"/calendar/{token}.ics", HTTP_IF_NONE_MATCH=first["ETag"])
    assert again.status_code == 304 and again.content == b""
    booking = Reservation.objects.filter(user=ana).first()
    assert booking is not None
    Reservation.objects.filter(pk=booking.pk).update(note="bring the eval set")
    changed = Client().get(f"/calendar/{token}.ics", HTTP_IF_NONE_MATCH=first["ETag"])
    assert changed.status_code == 200 and changed["ETag"] != first["ETag"]
    assert "bring the eval set" in changed.content.decode()


@pytest.mark.django_db
def test_the_agenda_lists_a_weeks_bookings_day_by_day_in_time_order(frozen, ana, bo):
    """The calendar as a list, for a phone where an hour's block is a sliver: each day from the
    one chosen, its bookings across channels in time order, yours said in words."""
    chat = factories.preset(factories.llm("qwen"), "chat")
    a, b = factories.channel("a100-0"), factories.channel("a100-1")
    day = timezone.localdate() + timedelta(days=1)
    at = lambda hour: datetime.combine(day, time(hour), tzinfo=timezone.get_current_timezone())  # noqa: E731
    factories.reservation(owner=bo, on=b, start=at(14), end=at(15), target=chat)
    factories.reservation(owner=ana, on=a, start=at(9), end=at(10), target=chat)
    factories.reservation(owner=bo, on=a, start=at(11), end=at(12), target=chat)
    page = client_for(ana).get("/calendar/", {"view": "agenda", "day": f"{day:%Y-%m-%d}"}).content.decode()
    agenda = page[page.index('id="agenda"') :]
    assert agenda.count("<h2>") == 7 and 'class="timeline' not in page
    first = agenda[: agenda.index("<h2>", agenda.index("<h2>") + 1)]
    items = [item.split("</li>")[0] for item in first.split("<li")[1:]]
    assert "09:00" in items[0] and "a100-0: yours" in items[0], items
    assert "a100-0: bo" in items[1] and "a100-1: bo" in items[2], items
    assert "Nothing booked." in agenda  # the other days


@pytest.mark.django_db
def test_a_persons_week_starts_on_the_day_they_chose(ana):
    """Monday by default; a lab that counts weeks from Sunday sets it in Settings, and the
    week view begins there."""
    client = client_for(ana)
    wednesday = date(2026, 12, 9)
    page = client.get("/calendar/", {"view": "week", "day": f"{wednesday:%Y-%m-%d}"}).content.decode()
    assert "week of Mon 7 Dec 2026" in page
    saved = client.post("/settings/", {"time_zone": "UTC", "email": "", "week_start": "6"})
    assert saved.status_code == 302
    page = client.get("/calendar/", {"view": "week", "day": f"{wednesday:%Y-%m-%d}"}).content.decode()
    assert "week of Sun 6 Dec 2026" in page
    bad = client.post("/settings/", {"time_zone": "UTC", "email": "", "week_start": "9"})
    assert bad.status_code == 200 and "week_start" in bad.content.decode()


def _month_cells(page: str) -> dict[str, str]:
    """Each day's cell of the month view, by its date."""
    table = page[page.index('id="month"') : page.index("</table>")]
    cells = {}
    for cell in table.split("<td ")[1:]:
        day = cell.index('data-day="') + len('data-day="')
        cells[cell[day : day + 10]] = cell.split("</td>")[0]
    return cells


def test_the_month_view_shows_each_days_bookings_and_blackouts_from_the_readers_week_start(frozen, ana, bo):
    """A booking tool's month: whole weeks from the reader's week start, each day with its first
    bookings in time order (yours said in words, one over midnight on both its days) and the
    rest counted, a blackout among them; a day's number opens its day view."""
    from reservations.models import Blackout

    chat = factories.preset(factories.llm("qwen"), "chat")
    a, b = factories.channel("a100-0"), factories.channel("a100-1")
    zone = timezone.get_current_timezone()
    at = lambda day, hour: datetime.combine(day, time(hour), tzinfo=zone)  # noqa: E731
    tuesday, wednesday = date(2026, 12, 8), date(2026, 12, 9)
    factories.reservation(owner=bo, on=a, start=at(tuesday, 14), end=at(tuesday, 15), target=chat)
    factories.reservation(owner=ana, on=a, start=at(tuesday, 9), end=at(tuesday, 10), target=chat)
    factories.reservation(owner=bo, on=b, start=at(tuesday, 22), end=at(wednesday, 2), target=chat)
    for hour in range(10, 16):  # six bookings on one day: four shown, two counted
        factories.reservation(
            owner=bo,
            on=b,
            start=at(date(2026, 12, 17), hour),
            end=at(date(2026, 12, 17), hour + 1),
            target=chat,
        )
    closed = Blackout.objects.create(
        start=at(date(2026, 12, 21), 8), end=at(date(2026, 12, 21), 12), reason="rack move"
    )
    closed.channels.set([b])
    page = client_for(ana).get("/calendar/", {"view": "month", "day": "2026-12-15"}).content.decode()
    assert "Calendar · December 2026" in page
    cells = _month_cells(page)
    assert min(cells) == "2026-11-30" and max(cells) == "2027-01-03" and len(cells) == 35  # Monday to Sunday
    items = [item.split("</li>")[0] for item in cells["2026-12-08"].split("<li")[1:]]
    assert len(items) == 3 and "09:00 a100-0 · yours" in items[0], items
    assert "14:00 a100-0 · bo" in items[1] and "22:00 a100-1 · bo" in items[2], items
    assert "22:00 a100-1 · bo" in cells["2026-12-09"]  # over midnight: on both days
    busy = cells["2026-12-17"]
    assert busy.count("a100-1 · bo") == 4 and "+2 more</a>" in busy and 'href="?day=2026-12-17' in busy
    assert (
        "08:00 closed: a100-1" in cells["2026-12-21"]
        and 'title="closed Mon 21 Dec 08:00–12:00 UTC: rack move"' in cells["2026-12-21"]
    )
    assert 'class="other' in cells["2026-11-30"] and 'class="other' not in cells["2026-12-01"]
    # Filtered to a100-0, the blackout of a100-1 and its bookings are gone.
    only_a = _month_cells(
        client_for(ana)
        .get("/calendar/", {"view": "month", "day": "2026-12-15", "channel": a.pk})
        .content.decode()
    )
    assert "closed" not in only_a["2026-12-21"] and "a100-1" not in only_a["2026-12-08"]
    # From Sunday for someone whose weeks begin then.
    profile = profile_for(ana)
    profile.week_start = 6
    profile.save()
    sunday_first = _month_cells(
        client_for(ana).get("/calendar/", {"view": "month", "day": "2026-12-15"}).content.decode()
    )
    assert min(sunday_first) == "2026-11-29" and max(sunday_first) == "2027-01-02"
