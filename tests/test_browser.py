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

from channels_app.models import ChannelRuntime
from channels_app.vocabulary import Phase
from reservations.models import Notification, Reservation
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


def sign_in(browser, live_server, username: str):
    page = browser.new_page(viewport={"width": 1200, "height": 800})
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
    assert "ana: qwen-7b / chat" in boss.content()
    shot(boss, "calendar")

    # The overview refreshes by itself when what runs changes.
    page.goto(f"{live_server.url}/")
    ChannelRuntime.objects.filter(channel=channel).update(phase=Phase.LOADING, since=timezone.now())
    page.wait_for_selector('section[data-channel="a100-0"] .phase.loading', timeout=15000)

    # Ana cancels it, and reads her notifications.
    page.goto(f"{live_server.url}/reservations/")
    page.click(f'tr[data-reservation="{booking.pk}"] button:has-text("Cancel")')
    page.wait_for_selector("text=Reservation cancelled.")
    booking.refresh_from_db()
    assert booking.status == "cancelled"
    assert Notification.objects.filter(user=ana, event="approved").exists()
    assert page.inner_text("#unread-count") == "1"
    page.goto(f"{live_server.url}/notifications/")
    assert "is approved" in page.content()
    shot(page, "notifications")
    page.click("text=Mark all read")
    page.wait_for_url(f"{live_server.url}/notifications/")
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
