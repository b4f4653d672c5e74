"""Recurring bookings: occurrences keep local times across DST, every occurrence is checked,
all are booked or none, and a series is cancelled one by one or all at once."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from reservations.models import Notification, Reservation
from reservations.recurrence import RecurrenceError, occurrences
from tests import factories
from tests.factories import iso
from tests.world import World

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
HOUR = timedelta(hours=1)


def test_weekly_occurrences_keep_the_local_time_across_the_change_to_summer_time():
    first = datetime(2027, 3, 16, 10, 0, tzinfo=BERLIN)  # a Tuesday, CET
    slots = occurrences(start=first, end=first + 2 * HOUR, zone=BERLIN, repeat="weekly", count=3)
    assert [(s.astimezone(BERLIN).strftime("%a %d %H:%M"), s.astimezone(UTC).hour) for s, _ in slots] == [
        ("Tue 16 10:00", 9),
        ("Tue 23 10:00", 9),
        ("Tue 30 10:00", 8),  # summer time since 28 March: still 10:00 in Berlin
    ]
    assert all((e - s) == 2 * HOUR for s, e in slots)


def test_weekdays_skip_the_weekend_and_until_is_inclusive():
    friday = datetime(2026, 12, 11, 9, 0, tzinfo=UTC)
    slots = occurrences(
        start=friday, end=friday + HOUR, zone=UTC, repeat="weekdays", until=date(2026, 12, 15)
    )
    assert [s.strftime("%a %d") for s, _ in slots] == ["Fri 11", "Mon 14", "Tue 15"]
    daily = occurrences(
        start=friday, end=friday + HOUR, zone=UTC, repeat="daily", until=date(2026, 12, 13), count=2
    )
    assert len(daily) == 2  # whichever comes first
    for bad, field in (
        ({"repeat": "hourly", "count": 2}, "repeat"),
        ({"repeat": "daily"}, "until"),
        ({"repeat": "daily", "count": 61}, "count"),
        ({"repeat": "daily", "until": date(2027, 12, 31)}, "until"),
        ({"repeat": "daily", "until": date(2026, 12, 1)}, "until"),
    ):
        with pytest.raises(RecurrenceError) as refused:
            occurrences(start=friday, end=friday + HOUR, zone=UTC, **bad)
        assert refused.value.field == field


def _days(slots):
    return [s.strftime("%a %d %b") for s, _ in slots]


def test_every_other_week_on_chosen_days_begins_with_the_first_slot():
    monday = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    slots = occurrences(
        start=monday, end=monday + HOUR, zone=UTC, repeat="weekly", every=2, on_days=(0, 2), count=5
    )
    assert _days(slots) == ["Mon 07 Dec", "Wed 09 Dec", "Mon 21 Dec", "Wed 23 Dec", "Mon 04 Jan"]
    # The first slot's own day is always one of them (a Wednesday start, Mondays chosen).
    wednesday = monday + timedelta(days=2)
    slots = occurrences(
        start=wednesday, end=wednesday + HOUR, zone=UTC, repeat="weekly", on_days=(0,), count=3
    )
    assert _days(slots) == ["Wed 09 Dec", "Mon 14 Dec", "Wed 16 Dec"]
    every_third_day = occurrences(start=monday, end=monday + HOUR, zone=UTC, repeat="daily", every=3, count=3)
    assert _days(every_third_day) == ["Mon 07 Dec", "Thu 10 Dec", "Sun 13 Dec"]


def test_monthly_keeps_the_date_and_skips_months_without_it():
    first = datetime(2027, 1, 31, 10, 0, tzinfo=BERLIN)
    slots = occurrences(start=first, end=first + HOUR, zone=BERLIN, repeat="monthly", count=4)
    assert _days(slots) == ["Sun 31 Jan", "Wed 31 Mar", "Mon 31 May", "Sat 31 Jul"]
    # Summer time: still 10:00 in Berlin.
    assert [s.astimezone(BERLIN).hour for s, _ in slots] == [10, 10, 10, 10]
    quarterly = occurrences(
        start=first - timedelta(days=16),
        end=first - timedelta(days=16) + HOUR,
        zone=BERLIN,
        repeat="monthly",
        every=3,
        until=date(2027, 12, 31),
    )
    assert _days(quarterly) == ["Fri 15 Jan", "Thu 15 Apr", "Thu 15 Jul", "Fri 15 Oct"]


def test_monthly_on_a_weekday_keeps_its_place_in_the_month_and_the_fifth_is_the_last():
    second_tuesday = datetime(2026, 12, 8, 14, 0, tzinfo=UTC)
    slots = occurrences(
        start=second_tuesday, end=second_tuesday + HOUR, zone=UTC, repeat="monthly_weekday", count=3
    )
    assert _days(slots) == ["Tue 08 Dec", "Tue 12 Jan", "Tue 09 Feb"]
    last_thursday = datetime(2026, 12, 31, 14, 0, tzinfo=UTC)  # the fifth Thursday: the last
    slots = occurrences(
        start=last_thursday, end=last_thursday + HOUR, zone=UTC, repeat="monthly_weekday", count=3
    )
    assert _days(slots) == ["Thu 31 Dec", "Thu 28 Jan", "Thu 25 Feb"]


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"repeat": "weekly", "every": 0}, "every"),
        ({"repeat": "weekly", "every": 53}, "every"),
        ({"repeat": "weekly", "on_days": (7,)}, "on_days"),
        ({"repeat": "daily", "on_days": (1,)}, "on_days"),
    ],
)
def test_a_bad_interval_or_day_names_its_field(bad, field):
    monday = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    with pytest.raises(RecurrenceError) as refused:
        occurrences(start=monday, end=monday + HOUR, zone=UTC, count=3, **bad)
    assert refused.value.field == field


@pytest.fixture
def setup(db, ana, bo, staff):
    qwen = factories.llm("qwen")
    chat = factories.preset(qwen, "chat")
    channel = factories.channel("a100-0")
    start = (timezone.now() + timedelta(days=1)).replace(hour=10, minute=0, second=0, microsecond=0)
    client = APIClient()
    client.force_authenticate(ana)
    return World(channel=channel, model=qwen, preset=chat, ana=ana, bo=bo, start=start, api=client)


def series_body(s, **extra):
    return {
        "channel": s.channel.pk,
        "start": iso(s.start),
        "end": iso(s.start + 2 * HOUR),
        "model": s.preset.model_id,
        "preset": s.preset.pk,
        "repeat": "weekly",
        "count": 4,
        "time_zone": "UTC",
        **extra,
    }


def test_a_series_with_one_conflicting_occurrence_lists_it_and_saves_nothing(setup, bo):
    s = setup
    third = s.start + timedelta(days=14)
    factories.reservation(owner=bo, on=s.channel, start=third + HOUR, end=third + 3 * HOUR, target=s.preset)
    refused = s.api.post("/api/reservations/series", series_body(s), format="json")
    assert refused.status_code == 409 and refused.data["code"] == "series_conflict"
    assert [c["start"] for c in refused.data["conflicts"]] == [iso(third).replace("+00:00", "Z")]
    assert "overlaps bo's booking" in refused.data["conflicts"][0]["reason"]
    assert "1 of 4 occurrences cannot be booked, so none was" in refused.data["message"]
    assert not Reservation.objects.filter(user__username="ana").exists()


def test_a_series_without_conflicts_is_booked_whole_and_cancelled_all_at_once(setup, ana, staff):
    s = setup
    made = s.api.post("/api/reservations/series", series_body(s), format="json")
    assert made.status_code == 201, made.data
    booked = Reservation.objects.filter(user=ana).order_by("start")
    assert [r.start for r in booked] == [s.start + timedelta(weeks=i) for i in range(4)]
    assert {r.series_id for r in booked} == {made.data["series"]} and {r.status for r in booked} == {
        "approved"
    }
    # One cancelled alone, then the rest at once.
    first = booked[0]
    assert s.api.post(f"/api/reservations/{first.pk}/cancel").status_code == 200
    rest = s.api.post(f"/api/reservations/series/{made.data['series']}/cancel")
    assert rest.status_code == 200 and len(rest.data["cancelled"]) == 3
    assert set(Reservation.objects.filter(user=ana).values_list("status", flat=True)) == {"cancelled"}
    other = APIClient()
    other.force_authenticate(factories.user("carl"))
    assert other.post(f"/api/reservations/series/{made.data['series']}/cancel").status_code == 404


def test_the_weekly_quota_counts_the_series_own_occurrences(setup):
    s = setup
    s.channel.weekly_quota_hours = Decimal(3)
    s.channel.save()
    daily = series_body(s, repeat="daily", count=3)  # 3 × 2 h, most of them in one week
    refused = s.api.post("/api/reservations/series", daily, format="json")
    assert refused.status_code == 409
    assert any("over your weekly quota" in c["reason"] for c in refused.data["conflicts"])


def test_a_series_that_needs_approval_waits_whole_and_staff_hear_once(setup, staff):
    s = setup
    s.channel.approval_policy = "all"
    s.channel.save()
    made = s.api.post("/api/reservations/series", series_body(s, count=3), format="json")
    assert {r["status"] for r in made.data["reservations"]} == {"pending"}
    told = Notification.objects.filter(user=staff, event="submitted")
    assert told.count() == 1 and "and 2 more occurrences of the series" in told.get().text


def test_bad_series_input_is_a_400_naming_the_field(setup):
    s = setup
    for extra, field in (
        ({"repeat": "yearly"}, "repeat"),
        ({"count": None}, "until"),
        ({"every": 0}, "every"),
        ({"on_days": ["funday"]}, "on_days"),
        ({"repeat": "daily", "on_days": ["mon"]}, "on_days"),
        ({"time_zone": "Nowhere/X"}, "time_zone"),
    ):
        answer = s.api.post("/api/reservations/series", series_body(s, **extra), format="json")
        assert answer.status_code == 400 and field in str(answer.data), (extra, answer.data)


def test_a_series_may_skip_the_dates_it_cannot_have_and_book_the_others(setup, bo):
    s = setup
    third = s.start + timedelta(days=14)
    factories.reservation(owner=bo, on=s.channel, start=third + HOUR, end=third + 3 * HOUR, target=s.preset)
    made = s.api.post("/api/reservations/series", series_body(s, skip_conflicts=True), format="json")
    assert made.status_code == 201, made.data
    assert len(made.data["reservations"]) == 3
    (skipped,) = made.data["skipped"]
    assert (
        skipped["start"] == iso(third).replace("+00:00", "Z") and "overlaps bo's booking" in skipped["reason"]
    )
    booked = sorted(Reservation.objects.filter(user__username="ana").values_list("start", flat=True))
    assert third not in booked and len(booked) == 3
    # Nothing left to book is still a 409: a series of only conflicts books nothing.
    Reservation.objects.filter(user__username="ana").delete()
    for week in (0, 7, 21):
        at = s.start + timedelta(days=week)
        factories.reservation(owner=bo, on=s.channel, start=at, end=at + HOUR, target=s.preset)
    none = s.api.post("/api/reservations/series", series_body(s, skip_conflicts=True), format="json")
    assert none.status_code == 409 and not Reservation.objects.filter(user__username="ana").exists()


def test_a_series_is_previewed_date_by_date_before_it_is_booked(setup, bo):
    s = setup
    third = s.start + timedelta(days=14)
    factories.reservation(owner=bo, on=s.channel, start=third + HOUR, end=third + 3 * HOUR, target=s.preset)
    body = series_body(s)
    seen = s.api.get("/api/reservations/series-preview", body)
    assert seen.status_code == 200, seen.data
    dates = seen.data["occurrences"]
    assert [d["start"] for d in dates] == [
        iso(s.start + timedelta(days=7 * n)).replace("+00:00", "Z") for n in range(4)
    ]
    assert [bool(d["problem"]) for d in dates] == [False, False, True, False]
    assert "overlaps bo's booking" in dates[2]["problem"]
    assert not Reservation.objects.filter(user__username="ana").exists()  # a look books nothing
    bad = s.api.get("/api/reservations/series-preview", {**body, "repeat": "hourly"})
    assert bad.status_code == 400 and "repeat" in bad.data


def test_a_series_every_other_week_on_two_days_is_booked_and_kept_as_asked(setup):
    s = setup
    thursday = s.start + timedelta(days=(3 - s.start.weekday()) % 7)
    s_thursday = World(**{**s.__dict__, "start": thursday})
    body = series_body(s_thursday, every=2, on_days=["mon", "thu"], count=4)
    seen = s.api.get("/api/reservations/series-preview", {**body, "on_days": body["on_days"]})
    assert seen.status_code == 200, seen.data
    expected = [thursday + timedelta(days=d) for d in (0, 11, 14, 25)]  # Thu, Mon, Thu, Mon: every other week
    assert [d["start"] for d in seen.data["occurrences"]] == [iso(e) for e in expected]
    made = s.api.post("/api/reservations/series", body, format="json")
    assert made.status_code == 201, made.data
    assert [r["start"] for r in made.data["reservations"]] == [iso(e) for e in expected]
    series = Reservation.objects.get(pk=made.data["reservations"][0]["id"]).series
    assert (series.repeat, series.every, series.on_days) == ("weekly", 2, [0, 3])


def test_a_monthly_series_on_the_same_weekday_through_the_portal(setup, ana, settings):
    # Three months on "the 2nd Tuesday" can end nine weeks ahead (from 8 December: 9 February,
    # 63 days), past the default horizon of 60 days: the test is about the weekday, not the horizon.
    settings.SLOTSERVE_DEFAULT_MAX_DAYS_AHEAD = 100
    s = setup
    page = factories.client_for(ana)
    local = timezone.localtime(s.start)
    made = page.post(
        "/book/",
        {
            "channel": s.channel.pk,
            "start": f"{local:%Y-%m-%dT%H:%M}",
            "end": f"{local + HOUR:%Y-%m-%dT%H:%M}",
            "model": s.model.pk,
            "preset": s.preset.pk,
            "repeat": "monthly_weekday",
            "count": 3,
            "every": 1,
        },
    )
    assert made.status_code == 302, made.content.decode()[-2000:]
    starts = list(Reservation.objects.filter(user=ana).order_by("start").values_list("start", flat=True))
    assert len(starts) == 3
    nth = (timezone.localtime(s.start).day - 1) // 7
    for start in starts:
        day = timezone.localtime(start)
        assert day.weekday() == local.weekday() and (
            (day.day - 1) // 7 == nth or (nth == 4 and day.day + 7 > 28)
        ), starts
    assert len({timezone.localtime(start).month for start in starts}) == 3
