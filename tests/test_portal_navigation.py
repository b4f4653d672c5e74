"""The portal's navigation on every page (docs/portal.md): a way past it by keyboard, one line of it
for staff at 1366 px, the tab's icon, where staff add nodes, channels, models and presets."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from reservations.models import Reservation, ReservationStatus
from reservations.notifications import notify
from reservations.profiles import profile_for
from tests import factories
from tests.factories import client_for
from tests.test_browser import CHROMIUM, browser, shot, sign_in  # noqa: F401  (browser: a fixture)

needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Chromium (apt-get install chromium)"
)


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_a_skip_link_leads_past_the_navigation_to_the_content_and_the_calendars_first_lane(
    browser,  # noqa: F811
    live_server,
):
    factories.user("ana")
    channel = factories.channel("a100-0")
    page = sign_in(browser, live_server, "ana")
    missing: list[str] = []
    page.on("response", lambda answer: missing.append(answer.url) if answer.status == 404 else None)
    page.goto(f"{live_server.url}/calendar/")
    # The first Tab from the top of the page reaches "Skip to the content", shown while focused.
    page.keyboard.press("Tab")
    focused = page.evaluate(
        "[document.activeElement.textContent, document.activeElement.getAttribute('href')]"
    )
    assert focused == ["Skip to the content", "#main"], focused
    box = page.locator("a.skip-link").first.bounding_box()
    assert box is not None and box["x"] >= 0 and box["y"] >= 0
    # The second goes to the first lane: one Enter, and the lane has the keyboard.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to the calendar's lanes"
    page.keyboard.press("Enter")
    lane = page.locator(f'.timeline[data-channel-id="{channel.pk}"]').first
    assert lane.evaluate("e => e === document.activeElement")
    # "Skip to the content" puts the next Tab inside the page's own content.
    page.goto(f"{live_server.url}/book/")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    assert page.evaluate("!!document.activeElement.closest('main')")
    assert page.evaluate("!document.activeElement.closest('nav')")
    # No page asks for something that is not there (the tab's icon included).
    assert missing == [], missing


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_the_staff_navigation_is_one_line_at_1366_pixels(browser, live_server):  # noqa: F811
    boss = factories.user("administrator", staff=True)
    profile = profile_for(boss)
    profile.time_zone, profile.time_zone_chosen = "America/New_York", True
    profile.save()
    ana = factories.user("ana")
    start = timezone.now() + timedelta(days=1)
    for n in range(12):  # a count beside Approvals and Notifications
        factories.reservation(
            owner=ana,
            on=factories.channel(f"a100-{n}"),
            start=start,
            end=start + timedelta(hours=1),
            status=ReservationStatus.PENDING,
        )
        notify(user=boss, event="submitted", text=f"news {n}")
    page = sign_in(browser, live_server, "administrator", width=1366, height=768)
    tops = page.evaluate(
        "[...document.querySelectorAll('#nav a, #nav button')].filter(e => e.getClientRects().length)"
        ".map(e => e.getBoundingClientRect().top)"
    )
    shot(page, "nav-staff-1366")
    assert len(tops) > 10 and max(tops) - min(tops) < 10, tops


@pytest.mark.django_db(transaction=True)
def test_the_tab_icon_is_served_and_named_on_every_page():
    client = Client()
    client.force_login(factories.user("ana"))
    page = client.get("/").content.decode()
    assert '<link rel="icon" href="/static/portal/slotserve.svg" type="image/svg+xml">' in page
    icon = client.get("/static/portal/slotserve.svg")
    assert icon.status_code == 200 and icon["content-type"] == "image/svg+xml"
    assert b"<svg" in b"".join(icon.streaming_content)  # type: ignore[attr-defined]
    # Programs that ask for /favicon.ico without reading the page are sent to it.
    old = Client().get("/favicon.ico")
    assert old.status_code == 301 and old["location"] == "/static/portal/slotserve.svg"


@pytest.mark.django_db(transaction=True)
def test_staff_are_shown_where_nodes_channels_models_and_presets_are_added():
    root = factories.user("root", staff=True, is_superuser=True)
    ana = factories.user("ana")
    staff, member = Client(), Client()
    staff.force_login(root)
    member.force_login(ana)
    for page in ("/", "/models/"):
        html = staff.get(page).content.decode()
        for where in (
            "/admin/channels_app/node/",
            "/admin/channels_app/channel/add/",
            "/admin/channels_app/llmmodel/add/",
        ):
            assert where in html, (page, where)
        assert "/admin/channels_app/" not in member.get(page).content.decode()


def test_pages_need_login(db):
    answer = Client().get("/")
    assert answer.status_code == 302
    assert answer["Location"].startswith("/accounts/login/")
    assert Client().get("/accounts/login/").status_code == 200


def test_csrf_is_enforced(portal, ana):
    answer = client_for(ana, csrf=True).post(f"/reservations/{portal.booked.pk}/end")
    assert answer.status_code == 403
    assert Reservation.objects.get(pk=portal.booked.pk).status == "approved"
