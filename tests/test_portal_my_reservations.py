"""My reservations (docs/portal.md): bookings kept apart by how they ended, moving one keeping its
length, the waitlist one joined."""

from __future__ import annotations

from datetime import datetime, time, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from reservations.models import Reservation, WaitlistEntry
from tests import factories
from tests.clock import PORTAL_T0, T0
from tests.factories import client_for
from tests.test_browser import CHROMIUM, browser, sign_in  # noqa: F401  (browser: a fixture)

HOUR = timedelta(hours=1)


needs_chromium = pytest.mark.skipif(
    not __import__("pathlib").Path(CHROMIUM).exists(), reason="needs Chromium (apt-get install chromium)"
)


def tomorrow_at(hour: int) -> datetime:
    day = (timezone.localtime() + timedelta(days=1)).date()
    return datetime.combine(day, time(hour), tzinfo=timezone.get_current_timezone())


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_the_waitlist_one_joined_is_listed_and_can_be_left(browser, live_server):  # noqa: F811
    from reservations.services import waitlist_join

    ana, bo = factories.user("ana"), factories.user("bo")
    channel = factories.channel("a100-0")
    start = tomorrow_at(10)
    factories.reservation(owner=bo, on=channel, start=start, end=start + timedelta(hours=2))
    waitlist_join(user=ana, channel=channel, start=start, end=start + timedelta(hours=1), now=timezone.now())
    page = sign_in(browser, live_server, "ana")
    page.goto(f"{live_server.url}/reservations/")
    waiting = page.locator("#waiting-for")
    assert "a100-0" in waiting.inner_text() and "10:00" in waiting.inner_text()
    waiting.locator("button", has_text="Leave").click()
    page.wait_for_selector("text=You no longer wait for a100-0")
    assert not WaitlistEntry.objects.filter(user=ana).exists()
    assert "nothing" in page.locator("#waiting-for").inner_text().lower()


@pytest.mark.django_db(transaction=True)
def test_nobody_leaves_someone_elses_waitlist_entry():
    ana, bo = factories.user("ana"), factories.user("bo")
    channel = factories.channel("a100-0")
    start = tomorrow_at(10)
    factories.reservation(owner=bo, on=channel, start=start, end=start + timedelta(hours=2))
    from reservations.services import waitlist_join

    entry = waitlist_join(
        user=ana, channel=channel, start=start, end=start + timedelta(hours=1), now=timezone.now()
    )
    client = Client()
    client.force_login(bo)
    assert client.post(f"/waitlist/{entry.pk}/leave").status_code == 404
    assert WaitlistEntry.objects.filter(pk=entry.pk).exists()


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_moving_a_bookings_start_moves_its_end_keeping_its_length(browser, live_server):  # noqa: F811
    ana = factories.user("ana")
    channel = factories.channel("a100-0")
    start = tomorrow_at(9)
    booking = factories.reservation(owner=ana, on=channel, start=start, end=start + timedelta(hours=3))
    later = start + timedelta(days=3)
    page = sign_in(browser, live_server, "ana")
    page.goto(f"{live_server.url}/reservations/{booking.pk}/change")
    page.fill("#id_start", f"{timezone.localtime(later):%Y-%m-%dT%H:%M}")
    assert page.input_value("#id_end") == f"{timezone.localtime(later + timedelta(hours=3)):%Y-%m-%dT%H:%M}"
    page.click("#change button[type=submit]")
    page.wait_for_selector("text=Reservation changed.")
    booking.refresh_from_db()
    assert (booking.start, booking.end) == (later, later + timedelta(hours=3))


@pytest.mark.django_db(transaction=True)
def test_a_moved_start_with_the_end_left_as_it_was_keeps_the_length_without_a_browser():
    ana = factories.user("ana")
    channel = factories.channel("a100-0")
    start = tomorrow_at(9)
    booking = factories.reservation(owner=ana, on=channel, start=start, end=start + timedelta(hours=3))
    later = start + timedelta(days=3)
    client = Client()
    client.force_login(ana)
    answer = client.post(
        f"/reservations/{booking.pk}/change",
        {
            "start": f"{timezone.localtime(later):%Y-%m-%dT%H:%M}",
            "end": f"{timezone.localtime(booking.end):%Y-%m-%dT%H:%M}",
            "note": "",
        },
    )
    assert answer.status_code == 302, answer.content.decode()[:2000]
    booking = Reservation.objects.get(pk=booking.pk)
    assert (booking.start, booking.end) == (later, later + timedelta(hours=3))


@pytest.mark.django_db
def test_my_reservations_keeps_cancelled_bookings_apart_and_says_how_past_ones_ended(frozen, ana):
    chat = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0")
    done = factories.reservation(owner=ana, on=channel, start=T0 - 3 * HOUR, end=T0 - 2 * HOUR, target=chat)
    dropped = factories.reservation(
        owner=ana, on=channel, start=T0 + 5 * HOUR, end=T0 + 6 * HOUR, target=chat, status="cancelled"
    )
    waiting = factories.reservation(
        owner=ana, on=channel, start=T0 - HOUR / 2, end=T0 + HOUR, target=chat, status="pending"
    )
    page = client_for(ana).get("/reservations/").content.decode()
    upcoming, rest = page.split("<h2>Cancelled or rejected</h2>")
    withdrawn, past = rest.split("<h2>Past</h2>")
    assert f'data-reservation="{waiting.pk}"' in upcoming, "a started pending booking still waits"
    assert f'data-reservation="{dropped.pk}"' in withdrawn and f'data-reservation="{dropped.pk}"' not in past
    row = past.split(f'data-reservation="{done.pk}"')[1].split("</tr>")[0]
    assert 'data-label="Status">completed' in row
    assert 'data-confirm="Cancel your booking of a100-0' in upcoming


def test_other_users_reservations_answer_404(portal, bo):
    for action in ("end", "cancel", "extend"):
        assert client_for(bo).post(f"/reservations/{portal.booked.pk}/{action}").status_code == 404
    assert Reservation.objects.get(pk=portal.booked.pk).status == "approved"


def test_end_and_extend_from_the_portal(portal, ana, bo):
    extended = client_for(ana).post(f"/reservations/{portal.booked.pk}/extend", {"end": "2026-12-07T07:00"})
    assert extended.status_code == 302
    assert Reservation.objects.get(pk=portal.booked.pk).end == PORTAL_T0 + 2 * HOUR
    factories.reservation(
        owner=bo,
        on=portal.channel,
        start=PORTAL_T0 + 2 * HOUR,
        end=PORTAL_T0 + 3 * HOUR,
        target=portal.preset,
    )
    blocked = client_for(ana).post(
        f"/reservations/{portal.booked.pk}/extend", {"end": "2026-12-07T09:00"}, follow=True
    )
    assert "overlaps reservation" in blocked.content.decode()
    assert Reservation.objects.get(pk=portal.booked.pk).end == PORTAL_T0 + 2 * HOUR
    ended = client_for(ana).post(f"/reservations/{portal.booked.pk}/end", follow=True)
    assert "Reservation ended" in ended.content.decode()
    assert Reservation.objects.get(pk=portal.booked.pk).status == "ended"
