"""The waitlist: told once, when the whole wished-for slot frees."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from reservations import services
from reservations.models import Notification, WaitlistEntry
from tests import factories
from tests.factories import iso
from tests.world import World

HOUR = timedelta(hours=1)


@pytest.fixture
def setup(db, ana, bo):
    chat = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0")
    start = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    held = factories.reservation(owner=bo, on=channel, start=start, end=start + 2 * HOUR, target=chat)
    client = APIClient()
    client.force_authenticate(ana)
    return World(
        channel=channel, model=chat.model, preset=chat, ana=ana, bo=bo, start=start, booked=held, api=client
    )


def wait(s, start, end):
    return s.api.post(
        "/api/waitlist/", {"channel": "a100-0", "start": iso(start), "end": iso(end)}, format="json"
    )


def test_waiting_for_a_taken_slot_and_told_once_when_it_is_cancelled(setup, ana, bo):
    s = setup
    joined = wait(s, s.start, s.start + HOUR)
    assert joined.status_code == 201, joined.data
    assert wait(s, s.start, s.start + HOUR).data["id"] == joined.data["id"], "joining twice is once"
    free = wait(s, s.start + 3 * HOUR, s.start + 4 * HOUR)
    assert free.status_code == 400 and "free now: book it" in free.data["message"]
    backwards = wait(s, s.start + HOUR, s.start)
    assert backwards.status_code == 400 and "end" in backwards.data
    services.reservation_cancel(reservation=s.booked, by=bo, now=timezone.now())
    told = Notification.objects.get(user=ana, event="slot_freed")
    assert "a100-0 is free" in told.text and told.link.startswith(f"/book/?channel={s.channel.pk}&start=")
    assert WaitlistEntry.objects.get(pk=joined.data["id"]).notified_at is not None
    listed = s.api.get("/api/waitlist/").data
    assert [e["id"] for e in listed] == [joined.data["id"]] and listed[0]["notified_at"]
    # Freed again later (nothing to tell: already told).
    again = factories.reservation(owner=bo, on=s.channel, start=s.start, end=s.start + HOUR, target=s.preset)
    services.reservation_cancel(reservation=again, by=bo, now=timezone.now())
    assert Notification.objects.filter(user=ana, event="slot_freed").count() == 1


def test_not_told_while_part_of_the_slot_is_still_taken_then_told_at_an_early_end(setup, ana, bo):
    s = setup
    wait(s, s.start + HOUR, s.start + 3 * HOUR)
    later = factories.reservation(
        owner=bo, on=s.channel, start=s.start + 2 * HOUR, end=s.start + 4 * HOUR, target=s.preset
    )
    services.reservation_cancel(reservation=s.booked, by=bo, now=timezone.now())
    assert not Notification.objects.filter(user=ana, event="slot_freed").exists()
    services.reservation_change(
        reservation=later, by=bo, now=timezone.now(), start=s.start + 5 * HOUR, end=s.start + 6 * HOUR
    )
    assert Notification.objects.filter(user=ana, event="slot_freed").count() == 1


def test_someone_elses_waitlist_is_not_yours(setup, bo):
    s = setup
    entry = wait(s, s.start, s.start + HOUR).data["id"]
    other = APIClient()
    other.force_authenticate(bo)
    assert other.get("/api/waitlist/").data == []
    assert other.delete(f"/api/waitlist/{entry}/").status_code == 404
    assert s.api.delete(f"/api/waitlist/{entry}/").status_code == 204
