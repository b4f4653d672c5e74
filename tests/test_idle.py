"""Slots that are not wasted: a model booking no request reaches is warned, then released."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings

from reservations.idle import apply_idle_rule
from reservations.models import Notification, Reservation, WaitlistEntry
from reservations.rules import IdleFacts, idle_step
from tests import clock, factories
from tests.world import World

T0 = clock.T0 + timedelta(hours=1)  # 09:00 UTC
MIN = timedelta(minutes=1)


@pytest.mark.parametrize(
    ("changes", "at", "step"),
    [
        ({}, 14, None),
        ({}, 15, "warn"),
        ({"warned_at": T0 + 15 * MIN}, 44, None),
        ({"warned_at": T0 + 15 * MIN}, 45, "release"),
        ({"warned_at": T0 + 20 * MIN}, 45, None),  # warned late: the full 30 minutes after it
        ({"warned_at": T0 + 20 * MIN}, 50, "release"),
        ({"used": True}, 50, None),
        ({"exclusive": True}, 50, None),
        ({"warn_minutes": None}, 50, None),
        ({"release_minutes": None, "warned_at": T0 + 15 * MIN}, 100, None),  # warn only
        ({}, 121, None),  # over
    ],
)
def test_the_idle_rule(changes, at, step):
    facts = IdleFacts(
        start=T0,
        end=T0 + 120 * MIN,
        exclusive=False,
        used=False,
        warn_minutes=15,
        release_minutes=30,
        warned_at=None,
    )
    from dataclasses import replace

    assert idle_step(replace(facts, **changes), T0 + at * MIN) == step


@pytest.fixture
def world(db, ana, bo):
    chat = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0")
    channel.idle_warn_minutes, channel.idle_release_minutes = 15, 30
    channel.save()
    idle = factories.reservation(owner=ana, on=channel, start=T0, end=T0 + 120 * MIN, target=chat)
    other = factories.channel("a100-1")
    other.idle_warn_minutes, other.idle_release_minutes = 15, 30
    other.save()
    factories.reservation(owner=bo, on=other, start=T0, end=T0 + 120 * MIN, target=chat)
    whole = factories.reservation(
        owner=bo, on=factories.channel("a100-2", policy="none"), start=T0, end=T0 + 120 * MIN
    )
    whole.channel.idle_warn_minutes = 15
    whole.channel.save()
    return World(channel=channel, model=chat.model, preset=chat, ana=ana, bo=bo, booked=idle)


@pytest.fixture
def others(world):
    """Bo's bookings beside ana's idle one: on a100-1 with a model, and a100-2 whole-card."""
    return tuple(Reservation.objects.filter(user=world.bo).order_by("channel__name"))


def count_a_request(reservation: Reservation) -> None:
    """One request through the gateway's own counting (in, then out with the reservation)."""
    from gateway.wire.counters import Counters

    async def once():
        counters = Counters(settings.REDIS_URL)
        ticket = await counters.enter(reservation.channel_id)
        await counters.leave(
            reservation.channel_id,
            ticket,
            user_id=reservation.user_id,
            reservation_id=reservation.pk,
            prompt=5,
            completion=3,
        )
        counters.close()

    asyncio.run(once())


def test_an_unused_booking_is_warned_then_released_and_the_waitlist_told(world, others, ana, bo):
    idle, (busy, whole) = world.booked, others
    count_a_request(busy)  # bo's booking was used, in Redis (not flushed yet)
    later = T0 + 60 * MIN
    WaitlistEntry.objects.create(user=bo, channel=world.channel, start=later, end=later + 30 * MIN)
    assert apply_idle_rule(now=T0 + 14 * MIN) == {"warned": 0, "released": 0}
    assert apply_idle_rule(now=T0 + 15 * MIN) == {"warned": 1, "released": 0}
    warning = Notification.objects.get(user=ana, event="idle_warning")
    assert "No request has reached your booking of a100-0" in warning.text and "09:45 UTC" in warning.text
    assert apply_idle_rule(now=T0 + 16 * MIN) == {"warned": 0, "released": 0}, "warned once"
    assert apply_idle_rule(now=T0 + 45 * MIN) == {"warned": 0, "released": 1}
    idle.refresh_from_db()
    assert (idle.status, idle.end, idle.released_idle_at) == ("ended", T0 + 45 * MIN, T0 + 45 * MIN)
    released = Notification.objects.get(user=ana, event="idle_released")
    assert "no request reached it in its first 45 minutes" in released.text
    assert Notification.objects.filter(user=bo, event="slot_freed").count() == 1
    busy.refresh_from_db()
    assert busy.status == "approved" and busy.idle_warned_at is None
    whole.refresh_from_db()
    assert whole.status == "approved" and not Reservation.objects.filter(
        idle_warned_at__isnull=False
    ).exclude(pk=idle.pk)


def test_a_request_before_the_release_keeps_the_booking(world, ana):
    idle = world.booked
    apply_idle_rule(now=T0 + 15 * MIN)
    Reservation.objects.filter(pk=idle.pk).update(requests=1)  # flushed from Redis by the tick
    apply_idle_rule(now=T0 + 50 * MIN)  # (bo's unused booking on a100-1 goes)
    idle.refresh_from_db()
    assert idle.status == "approved" and idle.released_idle_at is None
    assert not Notification.objects.filter(user=ana, event="idle_released").exists()


def test_the_rule_is_shown_with_the_booking_and_in_the_hints(world, ana):
    from django.test import Client

    client = Client()
    client.force_login(ana)
    # A day after both now and the world's own bookings (which a day from now met on their eve).
    later = max(datetime.now(UTC), T0 + 120 * MIN) + timedelta(days=1)
    future = factories.reservation(
        owner=ana, on=world.channel, start=later, end=later + timedelta(hours=1), target=world.booked.preset
    )
    page = client.get("/reservations/").content.decode()
    row = page.split(f'data-reservation="{future.pk}"')[1].split("</tr>")[0]
    assert "unused after 15 min: warned, released 30 min later" in row
    start = (datetime.now(UTC) + timedelta(days=2)).strftime("%Y-%m-%dT10:00")
    hints = client.get(
        "/api/reservations/hints",
        {
            "channel": world.channel.pk,
            "start": start,
            "end": start[:-5] + "11:00",
            "model": future.model_id,
        },
    ).json()["warnings"]
    assert any(w["code"] == "idle_rule" and "released to others" in w["message"] for w in hints)


def test_the_tick_runs_the_rule():
    from channels_app.scheduling.beat import PERIODIC_JOBS

    assert ("SlotServe unused bookings", "reservations.tasks.release_idle_bookings") in PERIODIC_JOBS
