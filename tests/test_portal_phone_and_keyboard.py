"""The portal on a phone and by keyboard (docs/portal.md): rows that become cards with their
buttons on the screen, a folded navigation, the calendar a day at a time; free time reached and
booked with the keyboard; "yours" told apart without colour, borders that can be seen, past time
greyed, and the time shown while dragging. A real browser (Playwright with Debian's Chromium)."""

from __future__ import annotations

from datetime import datetime, time, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from tests import factories
from tests.test_browser import CHROMIUM, browser, shot, sign_in  # noqa: F401  (browser: a fixture)

pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Chromium (apt-get install chromium)"),
    pytest.mark.django_db(transaction=True),
]


def phone(browser, live_server, username: str):  # noqa: F811
    return sign_in(browser, live_server, username, width=390, height=844)


def luminance(css: str) -> float:
    r, g, b = (int(v) / 255 for v in css[css.index("(") + 1 : css.index(")")].split(",")[:3])

    def lin(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_on_a_phone_rows_are_cards_with_their_buttons_on_screen_and_the_menu_folds(browser, live_server):  # noqa: F811
    ana = factories.user("ana")
    channel = factories.channel("a100-with-a-long-channel-name-0")
    start = timezone.now() + timedelta(days=1)
    booking = factories.reservation(owner=ana, on=channel, start=start, end=start + timedelta(hours=2))
    page = phone(browser, live_server, "ana")
    # The navigation is one line with a menu button; its links show when it is opened.
    assert page.is_visible("#nav-toggle") and not page.is_visible("#nav-links a[href='/calendar/']")
    page.click("#nav-toggle")
    assert page.is_visible("#nav-links a[href='/calendar/']")
    page.goto(f"{live_server.url}/reservations/")
    row = page.locator(f'tr[data-reservation="{booking.pk}"]')
    for name in ("Cancel", "Change", "Extend"):
        box = row.locator(f"text={name}").first.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, (name, box)
    shot(page, "phone-reservations-cards")
    # The calendar shows one day at a time, readable, and the page does not scroll sideways.
    page.goto(f"{live_server.url}/calendar/?view=week")
    assert "view=week" not in page.url
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
    shot(page, "phone-calendar")
    # Its agenda lists the booking in a line as wide as the screen, not a 14 px sliver.
    page.click("#agenda-link")
    item = page.locator("#agenda li").first
    box = item.bounding_box()
    assert box is not None and box["width"] >= 300 and channel.name in item.inner_text(), box
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
    shot(page, "phone-agenda")


def test_free_time_is_reached_and_booked_by_keyboard_from_the_calendar(browser, live_server):  # noqa: F811
    factories.user("ana")
    channel = factories.channel("a100-0")
    day = (timezone.localtime() + timedelta(days=1)).date()
    page = sign_in(browser, live_server, "ana")
    page.goto(f"{live_server.url}/calendar/?day={day:%Y-%m-%d}")
    lane = page.locator(f'.timeline[data-channel-id="{channel.pk}"]')
    page.focus("a.book-link")
    page.keyboard.press("Tab")  # from the channel's "Book…" link to its free time
    assert lane.evaluate("e => e === document.activeElement")
    assert "09:00–10:00" in page.inner_text("#lane-cursor")  # a free hour chosen, and said
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("Shift+ArrowRight")
    assert "10:00–11:30" in page.inner_text("#lane-cursor")
    page.keyboard.press("Enter")
    page.wait_for_url("**/book/?*")
    assert page.input_value("#id_start") == f"{day:%Y-%m-%d}T10:00"
    assert page.input_value("#id_end") == f"{day:%Y-%m-%d}T11:30"
    # The keyboard is where the form goes on: the first field still to fill has the focus.
    assert page.evaluate("document.activeElement.id") == "id_model"


def test_yours_is_told_apart_without_colour_borders_show_past_time_is_grey_and_a_drag_says_the_time(
    browser,  # noqa: F811
    live_server,
):
    ana, bo = factories.user("ana"), factories.user("bo")
    channel = factories.channel("a100-0")
    today = timezone.localdate()
    late = datetime.combine(today, time(22), tzinfo=timezone.get_default_timezone())
    if late <= timezone.now() + timedelta(minutes=30):  # near midnight: tomorrow's evening is as good
        late += timedelta(days=1)
    factories.reservation(owner=ana, on=channel, start=late, end=late + timedelta(minutes=45))
    factories.reservation(
        owner=bo, on=channel, start=late + timedelta(hours=1), end=late + timedelta(hours=2)
    )
    page = sign_in(browser, live_server, "ana")
    page.goto(f"{live_server.url}/calendar/?day={timezone.localtime(late):%Y-%m-%d}")
    mine, theirs = page.locator(".timeline .res.mine").first, page.locator(".timeline .res:not(.mine)").first
    assert "yours" in mine.inner_text().lower() and "yours" not in theirs.inner_text().lower()
    lane_bg = page.locator(".timeline").first.evaluate("e => getComputedStyle(e).backgroundColor")
    for block in (mine, theirs):
        border = block.evaluate("e => getComputedStyle(e).borderTopColor")
        assert contrast(border, lane_bg) >= 3, (border, lane_bg)
    # Past time is greyed, and a click there books nothing.
    page.goto(f"{live_server.url}/calendar/")
    past = page.locator(".timeline .past").first
    width = past.evaluate("e => e.getBoundingClientRect().width")
    assert width > 0
    line = page.locator(".timeline[data-channel-id]").first
    box = line.bounding_box()
    assert box is not None
    page.mouse.click(box["x"] + min(width, box["width"]) / 2, box["y"] + box["height"] / 2)
    assert "/book/" not in page.url
    # Dragging over tomorrow's free time shows the time chosen as it goes.
    page.goto(f"{live_server.url}/calendar/?day={today + timedelta(days=1):%Y-%m-%d}")
    box = page.locator(".timeline[data-channel-id]").first.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 14 / 24, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 15.5 / 24, y, steps=4)
    assert page.inner_text(".timeline .drag-label") == "14:00–15:30"
    shot(page, "calendar-dragging")
    page.mouse.up()
    page.wait_for_url("**/book/?*")


needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Chromium (apt-get install chromium)"
)


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_on_a_phone_the_keys_requests_usage_and_models_tables_are_cards(browser, live_server):  # noqa: F811
    from gateway.api_keys import api_key_create
    from gateway.models import RequestLog

    boss = factories.user("boss", staff=True)
    api_key_create(user=boss, name="a-notebook-key-with-a-long-name")
    channel = factories.channel("a100-with-a-long-channel-name-0")
    factories.llm("qwen2.5-coder-32b-instruct-q4_k_m")
    now = timezone.now()
    factories.reservation(
        owner=boss, on=channel, start=now - timedelta(hours=2), end=now - timedelta(hours=1)
    )
    RequestLog.objects.create(
        at=now - timedelta(minutes=5),
        user=boss,
        channel=channel,
        model="qwen2.5-coder-32b-instruct-q4_k_m",
        path="/channels/a100-with-a-long-channel-name-0/v1/chat/completions",
        status=403,
        duration_ms=3.0,
        error_code="gpu_reserved",
        error="channel a100-with-a-long-channel-name-0 is reserved by someone else until Sat 5 Dec 14:00 UTC",
    )
    page = sign_in(browser, live_server, "boss", width=390, height=844)
    for path in ("/keys/", "/requests/", "/usage/?by=channel&period=week", "/models/"):
        page.goto(f"{live_server.url}{path}")
        sideways = page.evaluate(
            "[...document.querySelectorAll('main table')].map(t => t.scrollWidth - t.clientWidth)"
        )
        assert sideways and max(sideways) <= 1, (path, sideways)
        assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0, path
        shot(page, "phone-" + path.strip("/").split("/")[0].split("?")[0])
    page.goto(f"{live_server.url}/keys/")
    box = page.locator("#keys-table button", has_text="Revoke").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, box


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_the_new_pages_read_on_a_desk_and_on_a_phone_without_sideways_scrolling(browser, live_server):  # noqa: F811
    """Blackouts, people, the month, the playground and a newcomer's invitation, each at 1366 px
    and 390 px (their screenshots in data/screenshots/)."""
    from django.contrib.auth.models import Group

    from reservations.joining import invite
    from reservations.models import Blackout

    boss = factories.user("boss", staff=True)
    for n in range(3):
        factories.user(f"colleague-with-a-long-name-{n}").groups.add(
            Group.objects.get_or_create(name="nlp")[0]
        )
    channel = factories.channel("a100-with-a-long-channel-name-0")
    chat = factories.preset(factories.llm("qwen2.5-coder-32b-instruct-q4_k_m"), "chat")
    now = timezone.now()
    for day in range(4):
        start = now + timedelta(days=day, hours=1)
        factories.reservation(
            owner=boss, on=channel, start=start, end=start + timedelta(hours=2), target=chat
        )
    closed = Blackout.objects.create(
        start=now + timedelta(days=1),
        end=now + timedelta(days=1, hours=4),
        reason="firmware update on the rack's switch",
    )
    closed.channels.set([channel])
    invite(by=boss, email="newcomer@uni.example", groups=[], now=now)
    paths = ("/closures/", "/people/", "/calendar/?view=month", "/playground/")
    for width, height, name in ((1366, 900, "desk"), (390, 844, "phone")):
        page = sign_in(browser, live_server, "boss", width=width, height=height)
        for path in paths:
            page.goto(f"{live_server.url}{path}")
            wider = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            sideways = page.evaluate(
                "[...document.querySelectorAll('main table')].map(t => t.scrollWidth - t.clientWidth)"
            )
            assert wider <= 0 and max(sideways, default=0) <= 1, (name, path, wider, sideways)
            shot(
                page,
                f"{name}-"
                + path.strip("/").split("/")[0].split("?")[0]
                + ("-month" if "month" in path else ""),
            )
        page.close()
