"""The portal as a lab's first week met it (docs/portal.md): clearing an override, the waitlist one
has joined, a moved booking's end, in a real browser (Playwright with Debian's Chromium) and
through the portal's own forms."""

from __future__ import annotations

from datetime import datetime, time, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from channels_app.models import ChannelRuntime, Override
from channels_app.scheduling.services import override_set
from reservations.models import Reservation, WaitlistEntry
from slotserve_base.vocabulary import Phase
from tests import factories
from tests.test_browser import CHROMIUM, browser, shot, sign_in  # noqa: F401  (browser: a fixture)

pytestmark = pytest.mark.django_db(transaction=True)
needs_chromium = pytest.mark.skipif(
    not __import__("pathlib").Path(CHROMIUM).exists(), reason="needs Chromium (apt-get install chromium)"
)


def tomorrow_at(hour: int) -> datetime:
    day = (timezone.localtime() + timedelta(days=1)).date()
    return datetime.combine(day, time(hour), tzinfo=timezone.get_current_timezone())


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


def test_adding_a_person_in_the_admin_asks_their_email_and_groups_and_a_user_without_one_is_flagged():
    from django.contrib.auth.models import Group, User

    root = factories.user("root", staff=True, is_superuser=True)
    vision = Group.objects.create(name="vision")
    admin = Client()
    admin.force_login(root)
    form = admin.get("/admin/auth/user/add/").content.decode()
    assert 'name="email"' in form and 'name="groups"' in form
    answer = admin.post(
        "/admin/auth/user/add/",
        {
            "username": "cy",
            "email": "cy@lab.example",
            "groups": [vision.pk],
            "password1": "a-long-pass-phrase-9",
            "password2": "a-long-pass-phrase-9",
            "usable_password": "true",
        },
    )
    assert answer.status_code == 302, answer.content.decode()[:3000]
    cy = User.objects.get(username="cy")
    assert cy.email == "cy@lab.example" and list(cy.groups.all()) == [vision]
    silent = factories.user("dee")
    silent.email = ""
    silent.save()
    page = admin.get(f"/admin/auth/user/{silent.pk}/change/").content.decode()
    assert "has no email" in page
    assert "has no email" not in admin.get(f"/admin/auth/user/{cy.pk}/change/").content.decode()


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


def test_opening_notifications_marks_them_read_and_shows_which_were_new():
    from reservations.models import Notification
    from reservations.notifications import notify

    ana = factories.user("ana")
    notify(user=ana, event="approved", text="a100-0: your booking is approved.", link="/", key="k1")
    client = Client()
    client.force_login(ana)
    assert Notification.objects.filter(user=ana, read=False).count() == 1
    first = client.get("/notifications/").content.decode()
    assert "your booking is approved" in first and 'class="new"' in first
    assert not Notification.objects.filter(user=ana, read=False).exists()
    assert 'class="new"' not in client.get("/notifications/").content.decode()


def test_a_channels_news_names_the_booking_by_its_channel_and_time_not_its_number():
    from reservations.notices import reservation_summary

    ana = factories.user("ana")
    channel = factories.channel("a100-0")
    start = tomorrow_at(10)
    booking = factories.reservation(owner=ana, on=channel, start=start, end=start + timedelta(hours=2))
    said = reservation_summary(booking, timezone.get_default_timezone())
    assert f"reservation {booking.pk}" not in said
    assert "ana's booking" in said and "10:00" in said


def test_the_keys_page_gives_the_base_url_ready_snippets_and_a_copy_button(settings):
    settings.SLOTSERVE_PUBLIC_URL = "https://gpu.lab.example"
    ana = factories.user("ana")
    client = Client()
    client.force_login(ana)
    page = client.post("/keys/", {"name": "notebook", "wait_seconds": 0}).content.decode()
    assert "https://gpu.lab.example/v1" in page
    assert "curl https://gpu.lab.example/v1/chat/completions" in page
    assert 'base_url="https://gpu.lab.example/v1"' in page  # Python's openai client
    assert 'data-copy="new-key"' in page
    key = page.split('id="new-key">')[1].split("<")[0]
    assert key.startswith("ss-") and f'api_key="{key}"' in page  # the snippets carry the new key


def test_the_calendar_feed_uses_the_public_address(settings):
    settings.SLOTSERVE_PUBLIC_URL = "https://gpu.lab.example"
    ana = factories.user("ana")
    client = Client()
    client.force_login(ana)
    assert "https://gpu.lab.example/calendar/" in client.get("/settings/").content.decode()


@needs_chromium
def test_the_free_slot_finder_looks_from_the_chosen_day_and_offers_each_free_stretch_once(
    browser,  # noqa: F811
    live_server,
):
    bo = factories.user("bo")
    factories.user("ana")
    qwen = factories.llm("qwen")
    node = factories.node("gpu-a", backends=["llama.cpp"])
    channel = factories.channel("a100-0", on=node)
    day = (timezone.localtime() + timedelta(days=3)).date()
    noon = datetime.combine(day, time(12), tzinfo=timezone.get_default_timezone())
    factories.reservation(owner=bo, on=channel, start=noon, end=noon + timedelta(hours=2))
    page = sign_in(browser, live_server, "ana")
    page.goto(f"{live_server.url}/book/")
    page.fill("#id_start", f"{day:%Y-%m-%d}T09:00")
    page.fill("#id_end", f"{day:%Y-%m-%d}T10:00")
    page.select_option("#id_model", str(qwen.pk))
    page.fill("#finder-hours", "2")
    page.click("#finder")
    page.wait_for_selector("#finder-results button")
    offers = page.locator("#finder-results button").all_inner_texts()
    # The chosen day, from 09:00 until bo's booking; then from 14:00 on: two stretches, not
    # 09:00, 11:00, 14:00, 16:00 … cut from them.
    assert len(offers) == 2, offers
    assert f"{day.day} {day:%b}" in offers[0] and "09:00–11:00" in offers[0] and "free until" in offers[0]
    assert "12:00" in offers[0].split("free until")[1]
    assert "14:00–16:00" in offers[1] and "free from then on" in offers[1]
    shot(page, "booking-free-stretches")


@needs_chromium
def test_the_dialog_chooses_the_only_model_and_says_each_problem_once(browser, live_server):  # noqa: F811
    factories.user("ana")
    qwen = factories.llm("qwen")
    channel = factories.channel("a100-0")
    page = sign_in(browser, live_server, "ana")
    day = (timezone.localtime() - timedelta(days=1)).date()  # yesterday: one rule broken
    page.goto(f"{live_server.url}/book/?channel={channel.pk}")
    assert page.input_value("#id_model") == str(qwen.pk)
    page.fill("#id_start", f"{day:%Y-%m-%d}T09:00")
    page.fill("#id_end", f"{day:%Y-%m-%d}T10:00")
    page.wait_for_selector("#hints li.blocking")
    hints = page.locator("#hints li").all_inner_texts()
    assert not any("Choose a model" in hint for hint in hints), hints
    assert len(hints) == len(set(hints)), hints
    beside = page.inner_text("#hint-for-start")
    assert len(beside.split("; ")) == len(set(beside.split("; "))), beside


def weekly_series_with_its_second_date_taken(browser, live_server, count: int):  # noqa: F811
    """ana's booking dialog, filled for a weekly series of ``count`` whose second date bo holds:
    the page, ana and the taken start."""
    ana, bo = factories.user("ana"), factories.user("bo")
    qwen = factories.llm("qwen")
    channel = factories.channel("a100-0")
    day = (timezone.localtime() + timedelta(days=2)).date()
    second = datetime.combine(day + timedelta(days=7), time(10), tzinfo=timezone.get_default_timezone())
    factories.reservation(owner=bo, on=channel, start=second, end=second + timedelta(hours=1))
    page = sign_in(browser, live_server, "ana")
    page.goto(f"{live_server.url}/book/")
    page.select_option("#id_channel", str(channel.pk))
    page.fill("#id_start", f"{day:%Y-%m-%d}T10:00")
    page.fill("#id_end", f"{day:%Y-%m-%d}T11:00")
    page.select_option("#id_model", str(qwen.pk))
    page.select_option("#id_repeat", "weekly")
    page.fill("#id_count", str(count))
    return page, ana, second


@needs_chromium
def test_a_series_shows_its_dates_first_and_books_the_others_skipping_a_conflict(browser, live_server):  # noqa: F811
    page, ana, second = weekly_series_with_its_second_date_taken(browser, live_server, 3)
    page.wait_for_selector("#series-preview li.conflict")
    dates = page.locator("#series-preview li").all_inner_texts()
    assert len(dates) == 3 and [("cannot be booked" in d) for d in dates] == [False, True, False], dates
    assert "overlaps bo's booking" in dates[1]
    shot(page, "booking-series-preview")
    page.check("#id_skip_conflicts")
    page.click("#booking button[type=submit]")
    page.wait_for_url(f"{live_server.url}/reservations/")
    assert "2 reservations of a100-0 booked." in page.content() and "Skipped" in page.content()
    booked = sorted(Reservation.objects.filter(user=ana).values_list("start", flat=True))
    assert len(booked) == 2 and second not in booked


def test_approvers_see_each_request_among_its_neighbours_and_approve_several_at_once():
    from reservations.models import Notification

    boss = factories.user("boss", staff=True)
    ana, bo = factories.user("ana"), factories.user("bo")
    channel = factories.channel("a100-0", policy="all")
    start = tomorrow_at(10)
    held = factories.reservation(
        owner=bo, on=channel, start=start - timedelta(hours=2), end=start - timedelta(hours=1)
    )
    asks = [
        factories.reservation(
            owner=ana,
            on=channel,
            start=start + timedelta(hours=2 * n),
            end=start + timedelta(hours=2 * n + 1),
            status="pending",
        )
        for n in range(3)
    ]
    client = Client()
    client.force_login(boss)
    page = client.get("/approvals/").content.decode()
    row = page.split(f'id="reservation-{asks[0].pk}"')[1].split("</tr>")[0]
    assert f"bo {start:%a} {start.day} {start:%b} 08:00–09:00" in row  # what is around it, dated
    assert f"/calendar/?day={start:%Y-%m-%d}" in row
    answer = client.post("/approvals/approve", {"reservation": [asks[0].pk, asks[2].pk]})
    assert answer.status_code == 302
    assert [Reservation.objects.get(pk=r.pk).status for r in asks] == ["approved", "pending", "approved"]
    assert Notification.objects.filter(user=ana, event="approved").count() == 2
    assert held.pk not in {r.pk for r in asks}
    # Someone who approves nothing gets nothing of it.
    stranger = Client()
    stranger.force_login(bo)
    assert stranger.post("/approvals/approve", {"reservation": [asks[1].pk]}).status_code == 403
    assert Reservation.objects.get(pk=asks[1].pk).status == "pending"
