"""The booking page and its dialog (docs/portal.md): the channels one may book, "any channel that
fits", a series' dates and verdicts, the start and the length, the free-slot finder, and the
hints beside each field, read in the booker's zone as the submit reads them."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.test import Client
from django.utils import timezone

from reservations.models import Reservation
from reservations.profiles import profile_for
from tests import factories
from tests.clock import T0, eventually
from tests.factories import client_for, in_zone
from tests.test_browser import CHROMIUM, browser, shot, sign_in  # noqa: F401  (browser: a fixture)

HOUR = timedelta(hours=1)


def hints(client: Client, channel, start: str, end: str, **extra) -> Any:
    answer = client.get(
        "/api/reservations/hints", {"channel": channel.pk, "start": start, "end": end, **extra}
    )
    assert answer.status_code == 200, answer.content
    return answer.json()["warnings"]


needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Chromium (apt-get install chromium)"
)


def weekly_series_with_its_second_date_taken(browser, live_server, count: int, zone: str = ""):  # noqa: F811
    """ana's booking dialog, filled for a weekly series of ``count`` whose second date bo holds
    (ana typing in ``zone`` where one is named): the page, ana and the taken start."""
    ana, bo = factories.user("ana"), factories.user("bo")
    if zone:
        in_zone(ana, zone)
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


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_any_channel_that_fits_tells_members_why_in_words_and_staff_the_scores(browser, live_server):  # noqa: F811
    factories.user("ana")
    factories.user("boss", staff=True)
    qwen = factories.llm("qwen")
    factories.channel("a100-0", on=factories.node("gpu-1", backends=["llama.cpp"]))
    day = (timezone.localtime() + timedelta(days=1)).date()

    def suggestion(username: str) -> str:
        page = sign_in(browser, live_server, username)
        page.goto(f"{live_server.url}/book/")
        page.select_option("#id_model", str(qwen.pk))
        page.fill("#id_start", f"{day:%Y-%m-%d}T09:00")
        page.fill("#id_end", f"{day:%Y-%m-%d}T10:00")
        page.wait_for_selector("#hints li[data-code=suggestion]")
        return str(page.inner_text("#hints li[data-code=suggestion]"))

    said = suggestion("ana")
    assert said.startswith("Will book: a100-0") and "score" not in said and "placement" not in said, said
    assert "room for qwen" in said, said
    assert "score" in suggestion("boss")


@pytest.mark.django_db(transaction=True)
def test_the_booking_form_offers_only_the_channels_one_may_book():
    from django.contrib.auth.models import Group

    nlp, vision = Group.objects.create(name="nlp"), Group.objects.create(name="vision")
    ana = factories.user("ana")
    ana.groups.add(vision)
    closed, open_, shared = (
        factories.channel("a100-0"),
        factories.channel("a100-1"),
        factories.channel("a100-2"),
    )
    closed.allowed_groups.add(nlp)
    shared.allowed_groups.add(nlp, vision)
    client = Client()
    client.force_login(ana)
    page = client.get("/book/").content.decode()
    offered = page[page.index('name="channel"') : page.index("</select>", page.index('name="channel"'))]
    assert f'value="{open_.pk}"' in offered and f'value="{shared.pk}"' in offered
    assert f'value="{closed.pk}"' not in offered
    start = timezone.localtime() + timedelta(days=1)
    sent = client.post(
        "/book/",
        {
            "channel": closed.pk,
            "start": f"{start:%Y-%m-%d}T09:00",
            "end": f"{start:%Y-%m-%d}T10:00",
            "exclusive": "on",
        },
    )
    assert "for the groups nlp" in sent.content.decode()
    staff = factories.user("boss", staff=True)
    client.force_login(staff)
    page = client.get("/book/").content.decode()
    assert f'value="{closed.pk}"' in page  # staff book every channel


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_a_series_with_one_clash_gives_one_verdict_not_an_all_clear_beside_it(browser, live_server):  # noqa: F811

    page, _, _ = weekly_series_with_its_second_date_taken(browser, live_server, 4)
    page.wait_for_selector("#hints li[data-code=series]")
    hints = page.locator("#hints li").all_inner_texts()
    assert not any("No conflicts" in hint for hint in hints), hints
    assert any("1 of 4 dates cannot be booked" in hint for hint in hints), hints
    # The dates are listed above the hints, and the hint says so.
    assert any("(each is listed above)" in hint for hint in hints), hints
    dates, verdicts = page.locator("#series-preview").bounding_box(), page.locator("#hints").bounding_box()
    assert dates is not None and verdicts is not None and dates["y"] < verdicts["y"]
    # Sent as it is, the page says why, and still gives no all-clear.
    page.click("#booking button[type=submit]")
    page.wait_for_selector("#hints li[data-code=series]")
    assert "1 of 4 occurrences cannot be booked" in page.content()
    assert not any("No conflicts" in hint for hint in page.locator("#hints li").all_inner_texts())
    # Skipping the clash is a booking that can be made, and the verdict says what it leaves out:
    # no all-clear while a date will be skipped.
    page.check("#id_skip_conflicts")
    page.wait_for_selector("#hints li[data-code=series_skipped]")
    skipped = page.locator("#hints li[data-code=series_skipped]").inner_text()
    assert skipped == "1 of 4 dates will be skipped (each is listed above); the other 3 will be booked."
    assert not page.locator("#hints li.ok, #hints li.blocking").count()


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_a_weekly_series_every_other_week_on_a_second_day_is_previewed(browser, live_server):  # noqa: F811
    """The dialog's own repeat: every N weeks, on days ticked besides the first's; the days
    are offered only for a weekly series, and each date is listed before anything is booked."""
    page, _, _ = weekly_series_with_its_second_date_taken(browser, live_server, 4)
    assert page.locator("#repeat-days").is_visible() and page.inner_text("#every-unit") == "weeks"
    page.fill("#id_every", "2")
    first = date.fromisoformat(page.input_value("#id_start")[:10])
    also = (first.weekday() + 1) % 7  # the day after the first's
    page.check(f'input[name="on_days"][value="{also}"]')
    expected = [f"{first + timedelta(days=d):%a %-d %b}" for d in (0, 1, 14, 15)]

    def listed() -> list[str]:
        return [d.split(" ", 3)[:3] for d in page.locator("#series-preview li").all_inner_texts()]

    assert eventually(lambda: [" ".join(d) for d in listed()] == expected), listed()
    dates = page.locator("#series-preview li").all_inner_texts()
    assert all(d.endswith("free") for d in dates), dates  # the week bo holds is skipped over
    page.select_option("#id_repeat", "monthly")
    assert not page.locator("#repeat-days").is_visible() and page.inner_text("#every-unit") == "months"


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_choosing_a_model_takes_the_channels_default_preset_or_its_only_one(browser, live_server):  # noqa: F811
    """Not "(no preset)", a needless switch at the start: the channel's own preset of the model,
    else the model's only preset; a model with several and none the channel's asks."""
    factories.user("ana")
    qwen, llama, mixed = factories.llm("qwen"), factories.llm("llama"), factories.llm("mixed")
    chat = factories.preset(qwen, "chat")
    factories.preset(qwen, "long")
    only = factories.preset(llama, "only")
    factories.preset(mixed, "a")
    factories.preset(mixed, "b")
    channel = factories.channel("a100-0", default=chat)
    page = sign_in(browser, live_server, "ana")
    page.goto(f"{live_server.url}/book/")
    page.select_option("#id_channel", str(channel.pk))
    page.select_option("#id_model", str(qwen.pk))
    assert page.input_value("#id_preset") == str(chat.pk)  # the channel's default, of two
    page.select_option("#id_model", str(llama.pk))
    assert page.input_value("#id_preset") == str(only.pk)  # the only one
    page.select_option("#id_model", str(mixed.pk))
    assert page.input_value("#id_preset") == ""  # two, neither the channel's: the person chooses


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_typing_a_start_keeps_the_length_and_a_changed_length_is_said_before_saving(browser, live_server):  # noqa: F811
    """Real key presses in Chromium's own date-time fields (en-US: a leading 0 in the hour empties
    the field for a moment): the end follows the start through it."""
    from datetime import datetime, time

    ana = factories.user("ana")
    channel = factories.channel("a100-0")
    day = (timezone.localtime() + timedelta(days=1)).date()
    start = datetime.combine(day, time(10), tzinfo=timezone.get_current_timezone())
    booking = factories.reservation(owner=ana, on=channel, start=start, end=start + timedelta(hours=2))
    page = sign_in(browser, live_server, "ana")
    page.goto(f"{live_server.url}/reservations/{booking.pk}/change")
    page.focus("#id_start")  # its month
    for _ in range(3):
        page.keyboard.press("ArrowRight")  # day, year, hour
    page.keyboard.type("02")
    assert page.input_value("#id_start") == f"{day:%Y-%m-%d}T02:00"
    assert page.input_value("#id_end") == f"{day:%Y-%m-%d}T04:00"
    assert "2 h" in page.inner_text("#length-said") and "was" not in page.inner_text("#length-said")
    # A change of the end that changes the length is said before it is saved.
    page.focus("#id_end")
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    page.keyboard.type("07")
    said = page.inner_text("#length-said")
    assert "5 h" in said and "was 2 h" in said, said
    page.click("#change button[type=submit]")
    page.wait_for_selector("text=Reservation changed.")
    booking.refresh_from_db()
    assert (timezone.localtime(booking.start).hour, timezone.localtime(booking.end).hour) == (2, 7)
    # On the book page, typing the start's day moves the end's day too.
    later = day + timedelta(days=1 if day.day < 27 else -1)
    page.goto(
        f"{live_server.url}/book/?channel={channel.pk}&start={day:%Y-%m-%d}T14:00Z&end={day:%Y-%m-%d}T15:30Z"
    )
    page.focus("#id_start")
    page.keyboard.press("ArrowRight")  # its day
    page.keyboard.type(f"{later.day:02d}")
    assert page.input_value("#id_start") == f"{later:%Y-%m-%d}T14:00"
    assert page.input_value("#id_end") == f"{later:%Y-%m-%d}T15:30"


@pytest.mark.django_db(transaction=True)
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


@pytest.mark.django_db(transaction=True)
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


@pytest.mark.django_db(transaction=True)
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


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_a_series_preview_names_the_zone_as_the_rest_of_the_portal_does(browser, live_server):  # noqa: F811
    """One name for a zone on a page: "IST" in the dates as in the server's words, not "GMT+5:30"."""
    page, _, _ = weekly_series_with_its_second_date_taken(browser, live_server, 2, zone="Asia/Kolkata")
    page.wait_for_selector("#series-preview li")
    dates = page.locator("#series-preview li").all_inner_texts()
    assert len(dates) == 2 and all(" IST" in d and "GMT" not in d for d in dates), dates


@pytest.mark.django_db
def test_hints_read_local_times_in_the_profiles_zone_as_the_submit_does(frozen, ana, bo):
    """One path from typed time to UTC: ``11:00`` typed by a Berlin user is 10:00 UTC both for the
    hints and for the booking."""
    in_zone(ana, "Europe/Berlin")
    chat = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0")
    factories.reservation(
        owner=bo, on=channel, start=T0 + 2 * HOUR, end=T0 + 3 * HOUR, target=chat
    )  # 11–12 CET
    client = client_for(ana)
    conflict = [
        w for w in hints(client, channel, "2026-12-07T11:00", "2026-12-07T12:00") if w["code"] == "conflict"
    ]
    assert (
        conflict
        and conflict[0]["message"] == "the slot overlaps bo's booking, Mon 7 Dec 11:00–12:00 CET (approved)"
    )
    assert not [
        w for w in hints(client, channel, "2026-12-07T12:00", "2026-12-07T13:00") if w["code"] == "conflict"
    ]
    booked = client.post(
        "/book/",
        {
            "channel": channel.pk,
            "start": "2026-12-07T12:00",
            "end": "2026-12-07T13:00",
            "model": chat.model_id,
            "preset": chat.pk,
        },
    )
    assert booked.status_code == 302
    assert Reservation.objects.get(user=ana).start == T0 + 3 * HOUR  # 12:00 CET = 11:00 UTC


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("start", "end", "limits", "field", "words"),
    [
        ("2026-12-07T07:00", "2026-12-07T08:30", {}, "start", "start is in the past"),
        (
            "2026-12-07T12:00",
            "2026-12-07T12:20",
            {"min_booking_minutes": 30},
            "end",
            "lasts at least 30 minutes",
        ),
        (
            "2026-12-07T12:00",
            "2026-12-07T18:00",
            {"max_booking_minutes": 240},
            "end",
            "lasts at most 4 hours",
        ),
        ("2026-12-30T12:00", "2026-12-30T13:00", {"max_days_ahead": 14}, "start", "at most 14 days ahead"),
        (
            "2026-12-07T12:00",
            "2026-12-07T16:00",
            {"weekly_quota_hours": Decimal(3)},
            "end",
            "over your weekly quota",
        ),
    ],
)
def test_every_rule_the_submit_enforces_is_a_blocking_hint_beside_its_field(
    frozen, ana, start, end, limits, field, words
):
    chat = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0")
    for name, value in limits.items():
        setattr(channel, name, value)
    channel.save()
    client = client_for(ana)
    found = [
        w
        for w in hints(client, channel, start, end, model=chat.model_id, preset=chat.pk)
        if w["code"] == "rule"
    ]
    assert [(w["field"], w["blocking"]) for w in found] == [(field, True)], found
    assert words in found[0]["message"]
    # ... and the submit refuses it with the same words.
    refused = client.post(
        "/book/",
        {"channel": channel.pk, "start": start, "end": end, "model": chat.model_id, "preset": chat.pk},
    )
    assert refused.status_code == 200 and words in refused.content.decode()
    assert not Reservation.objects.exists()


@pytest.mark.django_db
def test_a_whole_card_where_the_channel_allows_none_is_a_blocking_hint(frozen, ana):
    channel = factories.channel("a100-0")
    channel.allow_whole_card = False
    channel.save()
    found = hints(client_for(ana), channel, "2026-12-07T12:00", "2026-12-07T13:00", exclusive="true")
    rule = [w for w in found if w["code"] == "rule"]
    assert (
        rule
        and rule[0]["field"] == "exclusive"
        and "does not allow whole-card bookings" in rule[0]["message"]
    )


@pytest.mark.django_db
def test_a_bookable_slot_has_no_blocking_hint(frozen, ana):
    chat = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0")
    found = hints(client_for(ana), channel, "2026-12-07T12:00", "2026-12-07T13:00", model=chat.model_id)
    assert not [w for w in found if w.get("blocking")], found


def test_booking_form_in_shanghai_time_stores_utc(portal, bo):
    profile = profile_for(bo)
    profile.time_zone = "Asia/Shanghai"
    profile.save()
    answer = client_for(bo).post(
        "/book/",
        {
            "channel": portal.channel.pk,
            "start": "2026-12-08T14:00",
            "end": "2026-12-08T16:00",
            "model": portal.model.pk,
            "preset": portal.preset.pk,
        },
    )
    assert answer.status_code == 302, answer.content.decode()[:2000]
    made = Reservation.objects.get(user=bo)
    assert made.start == datetime(2026, 12, 8, 6, 0, tzinfo=UTC)
    assert made.end == datetime(2026, 12, 8, 8, 0, tzinfo=UTC)
    page = client_for(bo).get("/reservations/").content.decode()
    assert "Tue 8 Dec 2026 14:00 – 16:00" in page


def test_daylight_saving_change_inside_a_reservation(portal, bo):
    """25 October 2026, Berlin: clocks go back at 03:00, so 01:00–05:00 lasts five hours."""
    profile = profile_for(bo)
    profile.time_zone = "Europe/Berlin"
    profile.save()
    portal.channel.max_booking_minutes = 270
    portal.channel.save()
    form = {
        "channel": portal.channel.pk,
        "start": "2026-10-25T01:00",
        "end": "2026-10-25T05:00",
        "model": portal.model.pk,
        "preset": portal.preset.pk,
        "note": "night run",
    }
    with time_machine.travel(datetime(2026, 10, 20, tzinfo=UTC), tick=False):
        refused = client_for(bo).post("/book/", form)
        assert refused.status_code == 200
        assert "a booking on this channel lasts at most 270 minutes" in refused.content.decode()
        portal.channel.max_booking_minutes = 300
        portal.channel.save()
        assert client_for(bo).post("/book/", form).status_code == 302
    made = Reservation.objects.get(user=bo)
    assert made.end - made.start == timedelta(hours=5)
    assert made.start == datetime(2026, 10, 24, 23, 0, tzinfo=UTC)
    with time_machine.travel(datetime(2026, 10, 20, tzinfo=UTC), tick=False):
        page = client_for(bo).get("/reservations/").content.decode()
    assert "Sun 25 Oct 2026 01:00 – 05:00" in page


def test_a_time_that_does_not_exist_is_named(portal, bo):
    profile = profile_for(bo)
    profile.time_zone = "Europe/Berlin"
    profile.save()
    with time_machine.travel(datetime(2027, 3, 20, tzinfo=UTC), tick=False):
        answer = client_for(bo).post(
            "/book/",
            {
                "channel": portal.channel.pk,
                "start": "2027-03-28T02:30",
                "end": "2027-03-28T04:00",
                "model": portal.model.pk,
            },
        )
    assert answer.status_code == 200
    assert "interpreted in time zone Europe/Berlin; it may be ambiguous or it may not exist" in (
        answer.content.decode()
    )
    assert not Reservation.objects.filter(user=bo).exists()


def test_refused_booking_keeps_what_was_typed(portal, bo):
    answer = client_for(bo).post(
        "/book/",
        {
            "channel": portal.channel.pk,
            "start": "2026-12-07T05:30",
            "end": "2026-12-07T07:00",
            "model": portal.model.pk,
            "note": "my careful note",
        },
    )
    page = answer.content.decode()
    assert answer.status_code == 200
    assert f"overlaps reservation {portal.booked.pk}" in page
    assert "my careful note" in page
    assert 'value="2026-12-07T05:30"' in page
