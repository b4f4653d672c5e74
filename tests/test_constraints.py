"""The database itself states the invariants (STYLE.md habit 3)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from reservations.models import Reservation
from tests import factories


@pytest.fixture
def slot(db):
    owner = factories.user("owner")
    target = factories.preset(factories.llm("m"), "p")
    channel = factories.channel("c")
    start = timezone.now() + timedelta(hours=1)
    return {"owner": owner, "target": target, "channel": channel, "start": start}


def make(slot, start, end, status="approved"):
    return factories.reservation(
        owner=slot["owner"], on=slot["channel"], start=start, end=end, target=slot["target"], status=status
    )


def test_end_after_start(slot):
    with pytest.raises(IntegrityError), transaction.atomic():
        make(slot, slot["start"], slot["start"])


def test_model_or_whole_card(slot):
    with pytest.raises(IntegrityError), transaction.atomic():
        Reservation.objects.create(
            user=slot["owner"],
            channel=slot["channel"],
            start=slot["start"],
            end=slot["start"] + timedelta(hours=1),
            exclusive=False,
            model=None,
        )


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the exclusion constraint exists on PostgreSQL")
def test_postgres_refuses_overlapping_blocking_reservations(slot):
    start = slot["start"]
    make(slot, start, start + timedelta(hours=2))
    with pytest.raises(IntegrityError, match="reservation_no_overlap"), transaction.atomic():
        make(slot, start + timedelta(hours=1), start + timedelta(hours=3), status="pending")
    # Back to back is fine, and so is overlapping a cancelled reservation.
    make(slot, start + timedelta(hours=2), start + timedelta(hours=3))
    make(slot, start - timedelta(hours=1), start, status="approved")
    make(slot, start, start + timedelta(hours=1), status="cancelled")
