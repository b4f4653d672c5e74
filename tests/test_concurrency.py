"""The no-overlap rule holds under concurrent requests, on SQLite and PostgreSQL (docs/scheduling.md)."""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from reservations.models import Reservation
from tests import factories

THREADS = 20


@pytest.mark.django_db(transaction=True)
def test_twenty_threads_post_the_same_slot_exactly_one_wins():
    model = factories.llm("qwen")
    chat = factories.preset(model, "chat")
    channel = factories.channel("contested")
    users = [factories.user(f"racer{i}") for i in range(THREADS)]
    start = timezone.now() + timedelta(hours=1)
    payload = {
        "channel": channel.pk,
        "start": start.isoformat(),
        "end": (start + timedelta(hours=1)).isoformat(),
        "model": model.pk,
        "preset": chat.pk,
    }

    def book(user):
        def post() -> int:
            client = APIClient()
            client.force_authenticate(user)
            return client.post("/api/reservations/", payload, format="json").status_code

        return post

    statuses = _race([book(user) for user in users])
    assert sorted(statuses) == [201] + [409] * (THREADS - 1)
    assert Reservation.objects.filter(channel=channel).count() == 1


def _race(jobs) -> list[int]:
    """Run each job in its own thread, all released at once; returns their status codes."""
    barrier = threading.Barrier(len(jobs))
    statuses: list[int] = []
    errors: list[BaseException] = []

    def run(job) -> None:
        try:
            barrier.wait(timeout=30)
            statuses.append(job())
        except BaseException as exc:  # noqa: BLE001 — reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert errors == []
    return statuses


@pytest.mark.django_db(transaction=True)
def test_fifty_threads_book_overlapping_slots_and_none_overlap():
    import random

    model = factories.llm("qwen")
    channel = factories.channel("busy")
    base = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    rng = random.Random(7)
    users = [factories.user(f"booker{i}") for i in range(50)]
    slots = []
    for _ in users:
        start = base + timedelta(minutes=15 * rng.randrange(0, 24))
        slots.append((start, start + timedelta(minutes=15 * rng.randrange(1, 8))))

    def job(user, slot):
        def post() -> int:
            client = APIClient()
            client.force_authenticate(user)
            body = {
                "channel": channel.pk,
                "start": slot[0].isoformat(),
                "end": slot[1].isoformat(),
                "model": model.pk,
            }
            return client.post("/api/reservations/", body, format="json").status_code

        return post

    statuses = _race([job(u, s) for u, s in zip(users, slots, strict=True)])
    assert set(statuses) <= {201, 409}
    kept = list(Reservation.objects.blocking().filter(channel=channel).order_by("start"))
    assert len(kept) == statuses.count(201) >= 1
    for earlier, later in itertools.pairwise(kept):
        assert earlier.end <= later.start


@pytest.mark.django_db(transaction=True)
def test_an_extension_racing_a_new_booking_exactly_one_wins():
    model = factories.llm("qwen")
    channel = factories.channel("raced")
    owner, rival = factories.user("owner"), factories.user("rival")
    start = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    mine = factories.reservation(
        owner=owner, on=channel, start=start, end=start + timedelta(hours=1), target=None
    )

    def extend() -> int:
        client = APIClient()
        client.force_authenticate(owner)
        body = {"end": (start + timedelta(hours=2)).isoformat()}
        return client.post(f"/api/reservations/{mine.pk}/extend", body, format="json").status_code

    def book() -> int:
        client = APIClient()
        client.force_authenticate(rival)
        body = {
            "channel": channel.pk,
            "start": (start + timedelta(minutes=90)).isoformat(),
            "end": (start + timedelta(hours=3)).isoformat(),
            "model": model.pk,
        }
        return client.post("/api/reservations/", body, format="json").status_code

    for _ in range(3):
        statuses = _race([extend, book])
        assert sorted(statuses) in ([200, 409], [201, 409]), statuses
        blocking = list(Reservation.objects.blocking().filter(channel=channel).order_by("start"))
        for earlier, later in itertools.pairwise(blocking):
            assert earlier.end <= later.start
        # Reset for the next round.
        Reservation.objects.filter(user=rival).delete()
        Reservation.objects.filter(pk=mine.pk).update(end=start + timedelta(hours=1))
