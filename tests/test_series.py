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
        ({"repeat": "monthly"}, "repeat"),
        ({"count": None}, "until"),
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
