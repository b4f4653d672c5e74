"""Limits an admin sets per channel: shortest, longest, how far ahead, weekly quota."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine

from reservations.models import Reservation
from reservations.rules import BookingLimits, check_length_and_horizon, check_quota, hours_by_week
from tests import factories
from tests.clock import T0
from tests.factories import iso
from tests.world import World

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
        yield World(channel=channel, model=target.model, preset=target)


def post(client, world, start, end):
    return client.post(
        "/api/reservations/",
        {
            "channel": world.channel.pk,
            "start": iso(start),
            "end": iso(end),
            "model": world.preset.model_id,
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
            "channel": limited.channel.pk,
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
    limited.channel.allow_whole_card = False
    limited.channel.save()
    answer = ana_api.post(
        "/api/reservations/",
        {
            "channel": limited.channel.pk,
            "start": iso(T0 + HOUR),
            "end": iso(T0 + 2 * HOUR),
            "exclusive": True,
        },
    )
    assert answer.status_code == 400
    assert answer.data["message"] == "exclusive: channel limited does not allow whole-card bookings"


def test_past_reservations_cannot_be_extended(limited, ana):
    old = factories.reservation(
        owner=ana, on=limited.channel, start=T0 - 3 * HOUR, end=T0 - 2 * HOUR, target=limited.preset
    )
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(ana)
    with time_machine.travel(T0, tick=False):
        answer = client.post(f"/api/reservations/{old.pk}/extend", {"end": iso(T0)})
    assert answer.status_code == 409
    assert "over" in answer.data["message"]


@pytest.fixture
def needs_approval(limited):
    limited.channel.approval_policy = "all"
    limited.channel.save()
    return limited


def test_extending_an_approved_booking_asks_for_the_added_time(
    needs_approval, ana, ana_api, staff, staff_api
):
    """Staff approve one hour; the owner cannot make it more without approval (docs/security.md)."""
    with time_machine.travel(T0, tick=False):
        made = post(ana_api, needs_approval, T0 + HOUR, T0 + 2 * HOUR).data
        assert made["status"] == "pending"
        assert staff_api.post(f"/api/reservations/{made['id']}/approve").status_code == 200
        asked = ana_api.post(f"/api/reservations/{made['id']}/extend", {"end": iso(T0 + 3 * HOUR)})
        assert asked.status_code == 202, asked.data
        assert asked.data["status"] == "pending" and asked.data["extends"] == made["id"]
        assert (asked.data["start"], asked.data["end"]) == (iso(T0 + 2 * HOUR), iso(T0 + 3 * HOUR))
        # The approved part stays approved, with its own end.
        kept = Reservation.objects.get(pk=made["id"])
        assert kept.status == "approved" and kept.end == T0 + 2 * HOUR
        told = staff.notifications.get(key=f"submitted:{asked.data['id']}")
        # Named by what people know it by: its channel and its time, not a number.
        assert f"reservation {made['id']}" not in told.text
        assert f"to extend their booking of {needs_approval.channel.name} (now until" in told.text
        # The added time is held: nobody else can book it meanwhile.
        assert post(staff_api, needs_approval, T0 + 2 * HOUR, T0 + 3 * HOUR).status_code == 409
        # Asking again moves the pending extension; limits still count the whole booking.
        too_long = ana_api.post(f"/api/reservations/{made['id']}/extend", {"end": iso(T0 + 4 * HOUR)})
        assert too_long.status_code == 400 and "at most" in too_long.data["message"]
        # Approved, it runs on from the booked hour with the same model: no reload.
        assert staff_api.post(f"/api/reservations/{asked.data['id']}/approve").status_code == 200
        assert Reservation.objects.get(pk=asked.data["id"]).status == "approved"


def test_extending_respects_the_quota_when_it_asks(needs_approval, ana_api, staff_api):
    channel = needs_approval.channel
    channel.weekly_quota_hours = Decimal(2)
    channel.max_booking_minutes = None
    channel.save()
    with time_machine.travel(T0, tick=False):
        made = post(ana_api, needs_approval, T0 + HOUR, T0 + 2 * HOUR).data
        staff_api.post(f"/api/reservations/{made['id']}/approve")
        over = ana_api.post(f"/api/reservations/{made['id']}/extend", {"end": iso(T0 + 4 * HOUR)})
        assert over.status_code == 400 and "weekly quota" in over.data["message"]
        assert Reservation.objects.count() == 1


def test_staff_extend_at_once_and_channels_without_approval_extend_in_place(limited, ana_api, staff_api):
    with time_machine.travel(T0, tick=False):
        made = post(ana_api, limited, T0 + HOUR, T0 + 2 * HOUR).data
        assert made["status"] == "approved"
        grown = ana_api.post(f"/api/reservations/{made['id']}/extend", {"end": iso(T0 + 3 * HOUR)})
        assert (
            grown.status_code == 200 and grown.data["id"] == made["id"] and grown.data["status"] == "approved"
        )
        limited.channel.approval_policy = "all"
        limited.channel.max_booking_minutes = None
        limited.channel.save()
        by_staff = staff_api.post(
            f"/api/reservations/{made['id']}/extend", {"end": iso(T0 + 3 * HOUR + HOUR / 2)}
        )
        assert by_staff.status_code == 200 and by_staff.data["id"] == made["id"]
