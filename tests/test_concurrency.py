"""The no-overlap rule holds under concurrent requests, on SQLite and PostgreSQL (SPEC §5)."""

from __future__ import annotations

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
    barrier = threading.Barrier(THREADS)
    statuses: list[int] = []
    errors: list[BaseException] = []

    def book(user) -> None:
        client = APIClient()
        client.force_authenticate(user)
        try:
            barrier.wait(timeout=30)
            statuses.append(client.post("/api/reservations/", payload, format="json").status_code)
        except BaseException as exc:  # noqa: BLE001 — reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=book, args=(user,)) for user in users]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert errors == []
    assert sorted(statuses) == [201] + [409] * (THREADS - 1)
    assert Reservation.objects.filter(channel=channel).count() == 1
