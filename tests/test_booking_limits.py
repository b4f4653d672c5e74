"""Limits an admin sets per channel: shortest, longest, how far ahead, weekly quota."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine

from reservations.models import Reservation
from reservations.rules import BookingLimits, check_length_and_horizon, check_quota, hours_by_week
from tests import factories
from tests.factories import iso

T0 = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)  # a Monday
HOUR = timedelta(hours=1)


@pytest.mark.parametrize(
    ("minutes", "ahead_days", "refusal"),
    [
        (14, 0, ("end", "a booking on this channel lasts at least 15 minutes")),
        (15, 0, None),
        (240, 0, None),
        (241, 0, ("end", "a booking on this channel lasts at most 4 hours")),
        (60, 14, None),
        (60, 15, ("start", "bookings on this channel start at most 14 days ahead")),
    ],
)
def test_length_and_horizon(minutes, ahead_days, refusal):
    limits = BookingLimits(min_minutes=15, max_minutes=240, max_days_ahead=14)
    start = T0 + timedelta(days=ahead_days)
    got = check_length_and_horizon(start=start, end=start + timedelta(minutes=minutes), now=T0, limits=limits)
    assert (None if got is None else (got.field, got.message)) == refusal


def test_hours_by_week_splits_at_monday():
    sunday_night = datetime(2026, 12, 13, 22, 0, tzinfo=UTC)
    assert hours_by_week([(sunday_night, sunday_night + 4 * HOUR)]) == {
        datetime(2026, 12, 7, tzinfo=UTC): Decimal(2),
        datetime(2026, 12, 14, tzinfo=UTC): Decimal(2),
    }


def test_quota_counts_the_week_of_each_hour():
    held = [(T0, T0 + 6 * HOUR)]
    assert check_quota(start=T0 + 7 * HOUR, end=T0 + 11 * HOUR, held=held, quota_hours=Decimal(10)) is None
    refused = check_quota(start=T0 + 7 * HOUR, end=T0 + 12 * HOUR, held=held, quota_hours=Decimal(10))
    assert refused is not None
    assert refused.message == (
        "over your weekly quota on this channel: 10 hours a week, 4.00 left in the week of 2026-12-07"
    )
    next_week = T0 + timedelta(days=7)
    assert check_quota(start=next_week, end=next_week + 10 * HOUR, held=held, quota_hours=Decimal(10)) is None


@pytest.fixture
def limited(db):
    with time_machine.travel(T0, tick=False):
        target = factories.preset(factories.llm("qwen"), "chat")
        channel = factories.channel("limited")
        channel.weekly_quota_hours = Decimal(3)
        channel.max_booking_minutes = 120
        channel.save()
        yield {"channel": channel, "target": target}


def post(client, world, start, end):
    return client.post(
        "/api/reservations/",
        {
            "channel": world["channel"].pk,
            "start": iso(start),
            "end": iso(end),
            "model": world["target"].model_id,
        },
    )


def test_quota_through_the_api(limited, ana_api, staff_api):
    assert post(ana_api, limited, T0 + HOUR, T0 + 3 * HOUR).status_code == 201
    over = post(ana_api, limited, T0 + 4 * HOUR, T0 + 6 * HOUR)
    assert over.status_code == 400
    assert over.data["message"] == (
        "end: over your weekly quota on this channel: 3 hours a week, 1.00 left in the week of 2026-12-07"
    )
    hints = ana_api.get(
        "/api/reservations/hints",
        {
            "channel": limited["channel"].pk,
            "start": iso(T0 + 4 * HOUR),
            "end": iso(T0 + 5 * HOUR),
            "model": "qwen",
        },
    )
    assert hints.data["quota"] == {"hours": 3.0, "left": 1.0, "week": "2026-12-07"}
    assert post(ana_api, limited, T0 + 4 * HOUR, T0 + 5 * HOUR).status_code == 201
    # Staff are not held to the quota, but are to the longest booking.
    assert post(staff_api, limited, T0 + 6 * HOUR, T0 + 8 * HOUR).status_code == 201
    too_long = post(staff_api, limited, T0 + 9 * HOUR, T0 + 12 * HOUR)
    assert too_long.status_code == 400 and "at most 2 hours" in too_long.data["message"]


def test_extension_respects_quota_and_length(limited, ana_api):
    made = post(ana_api, limited, T0 + HOUR, T0 + 2 * HOUR).data
    grown = ana_api.post(f"/api/reservations/{made['id']}/extend", {"end": iso(T0 + 3 * HOUR)})
    assert grown.status_code == 200 and grown.data["end"] == iso(T0 + 3 * HOUR)
    too_long = ana_api.post(f"/api/reservations/{made['id']}/extend", {"end": iso(T0 + 4 * HOUR)})
    assert too_long.status_code == 400 and "at most 2 hours" in too_long.data["message"]
    shorter = ana_api.post(f"/api/reservations/{made['id']}/extend", {"end": iso(T0 + 2 * HOUR)})
    assert (
        shorter.status_code == 400
        and shorter.data["message"] == "end: the new end must be after the current end"
    )
    assert Reservation.objects.get(pk=made["id"]).end == T0 + 3 * HOUR


def test_whole_card_forbidden_on_a_channel(limited, ana_api):
    limited["channel"].allow_whole_card = False
    limited["channel"].save()
    answer = ana_api.post(
        "/api/reservations/",
        {
            "channel": limited["channel"].pk,
            "start": iso(T0 + HOUR),
            "end": iso(T0 + 2 * HOUR),
            "exclusive": True,
        },
    )
    assert answer.status_code == 400
    assert answer.data["message"] == "exclusive: channel limited does not allow whole-card bookings"


def test_past_reservations_cannot_be_extended(limited, ana):
    old = factories.reservation(
        owner=ana, on=limited["channel"], start=T0 - 3 * HOUR, end=T0 - 2 * HOUR, target=limited["target"]
    )
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(ana)
    with time_machine.travel(T0, tick=False):
        answer = client.post(f"/api/reservations/{old.pk}/extend", {"end": iso(T0)})
    assert answer.status_code == 409
    assert "over" in answer.data["message"]
