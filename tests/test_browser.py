"""The portal in a real browser: Playwright driving Debian's Chromium against a live server.

Screenshots of the main pages are written to ``$SLOTSERVE_SCREENSHOTS`` (default
``data/screenshots``). Without ``/usr/bin/chromium`` these tests are skipped and
say why; ``.ci/run`` installs it.
"""

from __future__ import annotations

import os
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from channels_app.models import ChannelRuntime
from reservations.models import Notification, Reservation
from slotserve_base.vocabulary import Phase
from tests import factories

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Chromium (apt-get install chromium)"),
    pytest.mark.django_db(transaction=True),
]
SHOTS = Path(
    os.environ.get("SLOTSERVE_SCREENSHOTS", Path(__file__).resolve().parent.parent / "data" / "screenshots")
)


@pytest.fixture
def browser():
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API runs an event loop
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield chromium
        chromium.close()


def sign_in(browser, live_server, username: str, *, width: int = 1200, height: int = 800):
    """A new page of ``width`` x ``height``, signed in as ``username``."""
    return signed_in(browser.new_page(viewport={"width": width, "height": height}), live_server, username)


def signed_in(page, live_server, username: str):
    """``page`` after signing in as ``username`` through the sign-in form."""
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    return page


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_book_approve_watch_cancel_and_read(browser, live_server, settings):
    staff = factories.user("boss", staff=True)
    ana = factories.user("ana")
    qwen = factories.llm("qwen-7b")
    chat = factories.preset(qwen, "chat", "-c 8192")
    channel = factories.channel("a100-0", default=chat, policy="all")
    ChannelRuntime.objects.create(channel=channel, phase=Phase.READY, model=qwen, preset=chat)
    start = timezone.localtime() + timedelta(days=1)
    start = start.replace(hour=10, minute=0, second=0, microsecond=0)

    # Ana books with the dialog; the hints say approval is needed before she submits.
    page = sign_in(browser, live_server, "ana")
    shot(page, "overview")
    page.goto(f"{live_server.url}/book/")
    page.select_option("#id_channel", str(channel.pk))
    page.fill("#id_start", start.strftime("%Y-%m-%dT%H:%M"))
    page.fill("#id_end", (start + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M"))
    page.select_option("#id_model", str(qwen.pk))
    page.select_option("#id_preset", str(chat.pk))
    page.wait_for_selector('#hints li[data-code="approval_required"]')
    shot(page, "booking-dialog")
    page.click("#booking button[type=submit]")
    page.wait_for_url(f"{live_server.url}/reservations/")
    assert "awaits approval" in page.content()
    booking = Reservation.objects.get(user=ana)
    assert booking.status == "pending"

    # Staff approve it from the approvals page.
    boss = sign_in(browser, live_server, "boss")
    boss.goto(f"{live_server.url}/approvals/")
    shot(boss, "approvals")
    boss.click(f'tr[data-reservation="{booking.pk}"] button:has-text("Approve")')
    boss.wait_for_selector("text=Approved.")
    booking.refresh_from_db()
    assert booking.status == "approved"
    boss.goto(f"{live_server.url}/calendar/?day={start:%Y-%m-%d}")
    assert '<span class="who">ana</span><span class="what">qwen-7b</span>' in boss.content()
    shot(boss, "calendar")

    # The overview refreshes by itself when what runs changes.
    page.goto(f"{live_server.url}/")
    ChannelRuntime.objects.filter(channel=channel).update(phase=Phase.LOADING, since=timezone.now())
    page.wait_for_selector('section[data-channel="a100-0"] .phase.loading', timeout=15000)

    # Ana cancels it, and reads her notifications.
    # Cancelling asks first; declining leaves the booking alone.
    page.goto(f"{live_server.url}/reservations/")
    asked: list[str] = []

    def decline(dialog):
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", decline)
    page.click(f'tr[data-reservation="{booking.pk}"] button:has-text("Cancel")')
    page.wait_for_timeout(300)
    assert asked and "Cancel your booking of a100-0" in asked[0]
    booking.refresh_from_db()
    assert booking.status == "approved"
    page.once("dialog", lambda dialog: dialog.accept())
    page.click(f'tr[data-reservation="{booking.pk}"] button:has-text("Cancel")')
    page.wait_for_selector("text=Reservation cancelled.")
    booking.refresh_from_db()
    assert booking.status == "cancelled"
    assert Notification.objects.filter(user=ana, event="approved").exists()
    assert page.inner_text("#unread-count") == "1"
    page.goto(f"{live_server.url}/notifications/")
    assert "is approved" in page.content()
    shot(page, "notifications")
    page.reload()  # opening the page marked them read
    assert page.query_selector("#unread-count") is None
    assert staff.is_staff


def test_the_booking_dialogs_model_list_says_which_models_exceed_the_channels_memory(browser, live_server):
    """Seed 000: 'exceeds VRAM' in the model list itself, for the channel chosen, not only as a
    hint after choosing."""
    factories.user("ana")
    small = factories.channel("small-0", on=factories.node("n-small", memory=8 * factories.GiB))
    large = factories.channel("large-0", on=factories.node("n-large", memory=80 * factories.GiB))
    big = factories.llm("big-70b", size=40 * factories.GiB)
    tiny = factories.llm("tiny-1b", size=1 * factories.GiB)
    page = sign_in(browser, live_server, "ana")
    page.goto(f"{live_server.url}/book/")

    def label(model) -> str:
        return str(page.eval_on_selector(f'#id_model option[value="{model.pk}"]', "o => o.textContent"))

    page.select_option("#id_channel", str(small.pk))
    assert "exceeds" in label(big) and "8.0 GiB" in label(big)
    assert "exceeds" not in label(tiny)
    page.select_option("#id_channel", str(large.pk))
    assert "exceeds" not in label(big)
    shot(page, "booking-dialog-model-fit")


def test_time_zones_first_sign_in_takes_the_browsers_and_hints_match_what_is_saved(browser, live_server):
    """A Berlin browser at first sign-in sets the profile's zone; a booking typed at 11:30 is
    hinted and stored as 11:30 Berlin (10:30 UTC). A user who chose UTC and opens SlotServe in a
    Berlin browser is offered the switch, and what they type is read in UTC for hints and saving
    alike (the defect: hints in the browser's zone, saving in the profile's)."""
    import zoneinfo
    from datetime import UTC, datetime, time

    from reservations.profiles import profile_for

    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    lena, bo = factories.user("lena"), factories.user("bo")
    qwen = factories.llm("qwen")
    chat = factories.preset(qwen, "chat")
    channel = factories.channel("a100-0")
    day = (timezone.now() + timedelta(days=2)).date()
    # bo holds 09:30–10:30 UTC, that is 10:30–11:30 in Berlin (winter: UTC+1) or 11:30–12:30 (summer).
    held_from = datetime.combine(day, time(9, 30), tzinfo=UTC)
    factories.reservation(
        owner=bo, on=channel, start=held_from, end=held_from + timedelta(hours=1), target=chat
    )
    offset = datetime.combine(day, time(12), tzinfo=berlin).utcoffset()
    assert offset is not None

    context = browser.new_context(timezone_id="Europe/Berlin", viewport={"width": 1200, "height": 800})
    page = context.new_page()
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", "lena")
    page.fill("#id_password", "pw-for-tests")
    page.click("button[type=submit]")
    # Not wait_for_function: it evaluates a string in the page, which the portal's
    # Content-Security-Policy forbids (no 'unsafe-eval').
    expect(page.locator("#nav-zone")).to_have_text("Europe/Berlin")
    profile = profile_for(lena)
    assert (profile.time_zone, profile.time_zone_chosen) == ("Europe/Berlin", True)

    def fill(page, start_local: datetime) -> None:
        page.goto(f"{live_server.url}/book/")
        page.select_option("#id_channel", str(channel.pk))
        page.select_option("#id_model", str(qwen.pk))
        page.select_option("#id_preset", str(chat.pk))
        page.fill("#id_start", start_local.strftime("%Y-%m-%dT%H:%M"))
        page.fill("#id_end", (start_local + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"))

    # Typed at bo's hour in Berlin: the conflict names bo and the Berlin time.
    bo_local = held_from.astimezone(berlin)
    fill(page, bo_local.replace(tzinfo=None))
    conflict = page.wait_for_selector('#hints li[data-code="conflict"]')
    text = conflict.inner_text()
    assert "bo's booking" in text and f"{bo_local:%H:%M}–" in text and bo_local.tzname() in text, text
    assert page.inner_text("#hint-for-start")  # beside the field too
    # One hour later it is free: hinted so, and saved at that Berlin time.
    free_local = (bo_local + timedelta(hours=1)).replace(tzinfo=None)
    fill(page, free_local)
    page.wait_for_selector("#hints li.ok")
    page.click("#booking button[type=submit]")
    page.wait_for_url(f"{live_server.url}/reservations/")
    mine = Reservation.objects.get(user=lena)
    assert mine.start == (held_from + timedelta(hours=1)).astimezone(UTC)
    context.close()

    # bo chose UTC; in a Berlin browser he is offered Berlin and keeps UTC.
    bo_profile = profile_for(bo)
    bo_profile.time_zone, bo_profile.time_zone_chosen = "UTC", True
    bo_profile.save()
    context = browser.new_context(timezone_id="Europe/Berlin", viewport={"width": 1200, "height": 800})
    page = context.new_page()
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", "bo")
    page.fill("#id_password", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_selector("#zone-offer:not([hidden])")
    assert "Europe/Berlin" in page.inner_text("#zone-offer")
    page.click("#zone-keep")
    assert profile_for(bo).time_zone == "UTC"
    page.reload()
    assert page.is_hidden("#zone-offer")  # not offered again for the same pair of zones
    # 11:30 typed means 11:30 UTC for the hints as for the booking: clear of bo's 09:30–10:30,
    # but lena holds 10:30–11:30 UTC, so 11:00 conflicts with her and names her.
    fill(page, datetime.combine(day, time(11, 0)))
    named = page.wait_for_selector('#hints li[data-code="conflict"]').inner_text()
    assert "lena's booking" in named and "UTC" in named, named
    fill(page, datetime.combine(day, time(11, 30)))
    page.wait_for_selector('#hints li.ok, #hints li[data-code="approval_required"]')
    assert page.query_selector('#hints li[data-code="conflict"]') is None
    page.click("#booking button[type=submit]")
    page.wait_for_url(f"{live_server.url}/reservations/")
    assert Reservation.objects.get(user=bo, start__date=day, start__hour=11).start.minute == 30
    context.close()


def test_every_page_fits_a_phone_and_the_admin_and_api_docs_load_cleanly(browser, live_server):
    """At 390 px no page scrolls sideways; the admin and the API docs load with no failed request
    and no console error (their static files come from this installation)."""
    boss = factories.user("boss", staff=True, is_superuser=True)
    ana = factories.user("ana")
    qwen = factories.llm("qwen-7b-instruct-with-a-long-name")
    chat = factories.preset(qwen, "chat")
    channel = factories.channel("a100-with-a-long-channel-name-0", default=chat, policy="all")
    start = timezone.now() + timedelta(days=1)
    for owner in (ana, boss):
        factories.reservation(
            owner=owner,
            on=channel,
            start=start,
            end=start + timedelta(hours=1),
            target=chat,
            status="pending" if owner == ana else "approved",
        )
        start += timedelta(hours=2)
    Notification.objects.create(
        user=boss, event="submitted", text="ana asks for a100-0, Tue 8 Dec 10:00–12:00 CET."
    )
    # A webhook with a long URL, its secret and a failed try in its log.
    from reservations.webhooks.services import webhook_create, webhook_test

    hook = webhook_create(
        owner=boss, url="https://hooks.chat.lab.invalid/services/T0000000/B0000000/XXXXXXXXXXXXXXXXXXXXXXXX"
    )
    webhook_test(webhook=hook, by=boss, now=timezone.now())
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    # Every page's own scripts run under the portal's Content-Security-Policy: none is refused.
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    signed_in(page, live_server, "boss")
    wide = []
    for path in [
        "/",
        "/calendar/",
        "/calendar/?view=week",
        "/book/",
        "/reservations/",
        "/models/",
        "/approvals/",
        "/usage/",
        "/notifications/",
        "/settings/",
        "/keys/",
        "/webhooks/",
        "/requests/",
        f"/channel/{channel.pk}/log",
    ]:
        page.goto(f"{live_server.url}{path}")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        if overflow > 0:
            culprits = page.evaluate(
                "() => [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right"
                " > window.innerWidth).slice(0, 5).map(e => e.tagName + '#' + e.id + '.' + e.className)"
            )
            wide.append((path, overflow, culprits))
    assert wide == [], f"pages wider than a 390 px phone (path, extra px): {wide}"
    assert refused == [], refused
    shot(page, "phone-logs")
    page.goto(f"{live_server.url}/webhooks/")
    page.click(f"#webhook-{hook.pk} summary")
    shot(page, "phone-webhooks")
    page.goto(f"{live_server.url}/reservations/")
    shot(page, "phone-reservations")
    context.close()

    anonymous = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
    for path in ["/accounts/login/", "/accounts/password_reset/"]:
        anonymous.goto(f"{live_server.url}{path}")
        assert anonymous.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0, path
    assert anonymous.is_visible("text=Forgot your password?") or path != "/accounts/login/"

    desk = browser.new_context(viewport={"width": 1200, "height": 800}).new_page()
    failed, errors = [], []
    desk.on("requestfailed", lambda request: failed.append(request.url))
    desk.on("response", lambda response: failed.append(response.url) if response.status >= 400 else None)
    desk.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    signed_in(desk, live_server, "boss")
    desk.goto(f"{live_server.url}/admin/channels_app/channel/{channel.pk}/change/")
    assert desk.input_value("#id_gpu_indexes") == "0"  # a field for indexes, not a JSON box
    shot(desk, "admin-channel")
    desk.goto(f"{live_server.url}/usage/?by=channel")
    assert desk.is_visible("figure.chart svg")  # the channels' shares, drawn here
    shot(desk, "usage")
    desk.goto(f"{live_server.url}/api/docs/")
    desk.wait_for_selector(".swagger-ui .info", timeout=15000)
    shot(desk, "api-docs")
    # The test server speaks no WebSocket: the overview's live socket fails there and the page
    # falls back to polling (under daphne or uvicorn it connects).
    local = [url for url in failed if url.startswith(live_server.url) and "/ws/" not in url]
    errors = [e for e in errors if "/ws/overview" not in e]
    assert local == [] and errors == [], (local, errors)


def test_book_from_the_calendar_find_free_slots_and_finish_by_keyboard(browser, live_server):
    """The calendar: a booking's details on click, filters by node, and a drag over free time
    opens the dialog with the channel and the time filled in; the free-slot finder fills them
    from placement; the dialog is completed with the keyboard alone."""
    from datetime import datetime, time

    ana, bo = factories.user("ana"), factories.user("bo")
    qwen = factories.llm("qwen")
    chat = factories.preset(qwen, "chat")
    nodes = [factories.node(name, backends=["llama.cpp"]) for name in ("gpu-a", "gpu-b")]
    first = factories.channel("a100-0", on=nodes[0])
    second = factories.channel("a100-1", on=nodes[1])
    day = (timezone.now() + timedelta(days=1)).date()
    tz = timezone.get_default_timezone()  # both users are in UTC
    held = datetime.combine(day, time(10), tzinfo=tz)
    factories.reservation(owner=bo, on=first, start=held, end=held + timedelta(hours=2), target=chat)
    page = sign_in(browser, live_server, "ana")

    page.goto(f"{live_server.url}/calendar/?day={day:%Y-%m-%d}")
    page.click('.row[data-channel="a100-0"] button.res')
    assert page.inner_text("#details-title") == "bo: qwen / chat"
    assert "10:00–12:00 UTC" in page.inner_text("#details-body") and "approved" in page.inner_text(
        "#details-body"
    )
    shot(page, "calendar-details")
    page.select_option('select[name="node"]', str(second.node_id))
    page.wait_for_url("**node=*")
    assert page.query_selector('.row[data-channel="a100-0"]') is None
    assert page.query_selector('.row[data-channel="a100-1"]') is not None

    # Drag over 14:00–16:00 on a100-1.
    line = page.locator('.row[data-channel="a100-1"] .timeline')
    box = line.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 14 / 24, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 15 / 24, y, steps=4)
    page.mouse.move(box["x"] + box["width"] * 16 / 24, y, steps=4)
    page.mouse.up()
    page.wait_for_url("**/book/?*")
    assert page.input_value("#id_channel") == str(second.pk)
    assert page.input_value("#id_start") == f"{day:%Y-%m-%d}T14:00"
    assert page.input_value("#id_end") == f"{day:%Y-%m-%d}T16:00"

    # The finder: the first free two hours that fit qwen, from now on.
    page.select_option("#id_model", str(qwen.pk))
    page.fill("#finder-hours", "2")
    page.click("#finder")
    offer = page.wait_for_selector("#finder-results button")
    offer.click()
    picked = page.input_value("#id_start")
    assert picked and page.input_value("#id_channel") in {str(first.pk), str(second.pk)}
    shot(page, "booking-free-slots")

    # By keyboard alone: a fresh dialog from the calendar link, model and preset by arrow keys,
    # then Enter on the Book button.
    page.goto(
        f"{live_server.url}/book/?channel={second.pk}&start={day:%Y-%m-%d}T18:00:00Z&end={day:%Y-%m-%d}T19:00:00Z"
    )
    page.focus("#id_model")
    page.keyboard.press("ArrowDown")
    assert page.input_value("#id_model") == str(qwen.pk)
    page.keyboard.press("Tab")
    page.keyboard.press("ArrowDown")
    assert page.input_value("#id_preset") == str(chat.pk)
    page.wait_for_selector("#hints li.ok")
    page.focus("#booking button[type=submit]")
    page.keyboard.press("Enter")
    page.wait_for_url(f"{live_server.url}/reservations/")
    booked = Reservation.objects.get(user=ana)
    assert (booked.channel_id, booked.start.hour, booked.preset_id) == (second.pk, 18, chat.pk)


def test_a_weekly_series_from_the_dialog_lists_its_conflict_then_books_whole(browser, live_server):
    from datetime import datetime, time

    ana, bo = factories.user("ana"), factories.user("bo")
    qwen = factories.llm("qwen")
    chat = factories.preset(qwen, "chat")
    channel = factories.channel("a100-0")
    day = (timezone.now() + timedelta(days=2)).date()
    tz = timezone.get_default_timezone()
    second = datetime.combine(day + timedelta(days=7), time(10), tzinfo=tz)
    factories.reservation(owner=bo, on=channel, start=second, end=second + timedelta(hours=1), target=chat)
    page = sign_in(browser, live_server, "ana")

    def book_series(hour: int) -> None:
        page.goto(f"{live_server.url}/book/")
        page.select_option("#id_channel", str(channel.pk))
        page.fill("#id_start", f"{day:%Y-%m-%d}T{hour:02d}:00")
        page.fill("#id_end", f"{day:%Y-%m-%d}T{hour + 1:02d}:00")
        page.select_option("#id_model", str(qwen.pk))
        page.select_option("#id_preset", str(chat.pk))
        page.select_option("#id_repeat", "weekly")
        page.fill("#id_count", "3")
        page.click("#booking button[type=submit]")

    book_series(10)
    listed = page.inner_text("#series-conflicts")
    assert "overlaps bo's booking" in listed and f"{second:%-d %b}" in listed, listed
    assert "1 of 3 occurrences cannot be booked" in page.content()
    assert not Reservation.objects.filter(user=ana).exists()
    shot(page, "booking-series-conflict")
    book_series(12)
    page.wait_for_url(f"{live_server.url}/reservations/")
    assert Reservation.objects.filter(user=ana, series__isnull=False).count() == 3
    assert "3 reservations of a100-0 booked." in page.content()


def test_the_waitlist_from_a_conflict_and_the_notification_after_a_cancellation(browser, live_server):
    from datetime import datetime, time

    from reservations import services

    ana, bo = factories.user("ana"), factories.user("bo")
    qwen = factories.llm("qwen")
    chat = factories.preset(qwen, "chat")
    channel = factories.channel("a100-0")
    day = (timezone.now() + timedelta(days=1)).date()
    held_from = datetime.combine(day, time(10), tzinfo=timezone.get_default_timezone())
    held = factories.reservation(
        owner=bo, on=channel, start=held_from, end=held_from + timedelta(hours=2), target=chat
    )
    page = sign_in(browser, live_server, "ana")
    page.goto(f"{live_server.url}/book/")
    page.select_option("#id_channel", str(channel.pk))
    page.select_option("#id_model", str(qwen.pk))
    page.fill("#id_start", f"{day:%Y-%m-%d}T10:30")
    page.fill("#id_end", f"{day:%Y-%m-%d}T11:30")
    page.click("#wait-for-slot")
    page.wait_for_selector("text=you will be told when this time frees")
    services.reservation_cancel(reservation=held, by=bo, now=timezone.now())
    page.goto(f"{live_server.url}/notifications/")
    assert "a100-0 is free" in page.content() and "10:30–11:30 UTC" in page.content()
    page.click("text=open")
    page.wait_for_url("**/book/?*")
    assert page.input_value("#id_start") == f"{day:%Y-%m-%d}T10:30"
    assert Notification.objects.filter(user=ana, event="slot_freed").count() == 1


def test_moving_and_shortening_a_booking_in_the_portal(browser, live_server):
    from datetime import datetime, time

    ana = factories.user("ana")
    qwen = factories.llm("qwen")
    chat, long = factories.preset(qwen, "chat"), factories.preset(qwen, "long")
    channel = factories.channel("a100-0")
    day = (timezone.now() + timedelta(days=1)).date()
    start = datetime.combine(day, time(9), tzinfo=timezone.get_default_timezone())
    booking = factories.reservation(
        owner=ana, on=channel, start=start, end=start + timedelta(hours=3), target=chat
    )
    page = sign_in(browser, live_server, "ana")
    page.goto(f"{live_server.url}/reservations/")
    page.click(f'tr[data-reservation="{booking.pk}"] a:has-text("Change")')
    page.wait_for_url(f"**/reservations/{booking.pk}/change")
    page.fill("#id_start", f"{day:%Y-%m-%d}T13:00")
    page.fill("#id_end", f"{day:%Y-%m-%d}T14:30")  # moved, and shorter
    page.select_option("#id_preset", str(long.pk))
    page.click("#change button[type=submit]")
    page.wait_for_selector("text=Reservation changed.")
    booking.refresh_from_db()
    assert (booking.start.hour, booking.end.hour, booking.end.minute, booking.preset_id) == (
        13,
        14,
        30,
        long.pk,
    )
    assert booking.status == "approved"
    shot(page, "reservation-changed")


def test_copy_buttons_copy_a_new_key_and_a_webhooks_secret(browser, live_server):
    """The keys page's and the webhooks page's Copy buttons put the text on the clipboard."""
    from reservations.webhooks.services import webhook_create

    ana = factories.user("ana")
    hook = webhook_create(owner=ana, url="https://hooks.chat.lab.invalid/ana")
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    page = signed_in(context.new_page(), live_server, "ana")
    page.goto(f"{live_server.url}/keys/")
    page.fill("#id_name", "notebook")
    page.click("#new-key-form button[type=submit]")
    key = page.text_content("#new-key")
    assert key
    page.click("button[data-copy=new-key]")
    expect(page.locator("button[data-copy=new-key]")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == key
    page.goto(f"{live_server.url}/webhooks/")
    page.click(f"#webhook-{hook.pk} summary")
    page.click(f"button[data-copy=secret-{hook.pk}]")
    expect(page.locator(f"button[data-copy=secret-{hook.pk}]")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == hook.secret
    context.close()
