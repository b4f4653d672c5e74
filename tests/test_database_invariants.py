"""The database itself states the invariants (docs/architecture.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from reservations.models import Reservation
from tests import factories
from tests.world import World


@pytest.fixture
def slot(db):
    owner = factories.user("owner")
    target = factories.preset(factories.llm("m"), "p")
    channel = factories.channel("c")
    start = timezone.now() + timedelta(hours=1)
    return World(channel=channel, model=target.model, preset=target, ana=owner, start=start)


def make(slot, start, end, status="approved"):
    return factories.reservation(
        owner=slot.ana, on=slot.channel, start=start, end=end, target=slot.preset, status=status
    )


def test_end_after_start(slot):
    with pytest.raises(IntegrityError), transaction.atomic():
        make(slot, slot.start, slot.start)


def test_model_or_whole_card(slot):
    with pytest.raises(IntegrityError), transaction.atomic():
        Reservation.objects.create(
            user=slot.ana,
            channel=slot.channel,
            start=slot.start,
            end=slot.start + timedelta(hours=1),
            exclusive=False,
            model=None,
        )


def test_the_database_refuses_overlapping_blocking_reservations(slot):
    """An exclusion constraint on PostgreSQL, triggers on SQLite: no code path can break it."""
    start = slot.start
    make(slot, start, start + timedelta(hours=2))
    with pytest.raises(IntegrityError, match="reservation_no_overlap"), transaction.atomic():
        make(slot, start + timedelta(hours=1), start + timedelta(hours=3), status="pending")
    # Back to back is fine, and so is overlapping a cancelled reservation.
    make(slot, start + timedelta(hours=2), start + timedelta(hours=3))
    make(slot, start - timedelta(hours=1), start, status="approved")
    make(slot, start, start + timedelta(hours=1), status="cancelled")


def _raw_insert(slot, start, end, status):
    table = Reservation._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO {table} (user_id, channel_id, start, "end", model_id, preset_id, exclusive, '
            "status, reject_reason, note, created, requests, prompt_tokens, completion_tokens) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, '', '', %s, 0, 0, 0)",
            [
                slot.ana.pk,
                slot.channel.pk,
                start,
                end,
                slot.preset.model_id,
                slot.preset.pk,
                False,
                status,
                timezone.now(),
            ],
        )


def test_raw_sql_cannot_write_an_overlap_either(slot):
    start = slot.start
    kept = make(slot, start, start + timedelta(hours=2))
    with pytest.raises(IntegrityError, match="reservation_no_overlap"), transaction.atomic():
        _raw_insert(slot, start + timedelta(minutes=30), start + timedelta(hours=1), "pending")
    _raw_insert(slot, start + timedelta(minutes=30), start + timedelta(hours=1), "rejected")  # holds nothing
    _raw_insert(slot, start + timedelta(hours=2), start + timedelta(hours=3), "approved")  # back to back
    table = Reservation._meta.db_table
    # An update that moves a reservation onto another, or revives a rejected one on top of it.
    overlap = pytest.raises(IntegrityError, match="reservation_no_overlap")
    with overlap, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f'UPDATE {table} SET "end" = %s WHERE id = %s', [start + timedelta(hours=4), kept.pk])
    overlap = pytest.raises(IntegrityError, match="reservation_no_overlap")
    with overlap, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET status = 'approved' WHERE status = 'rejected'")
    # Another channel's time is its own.
    other = factories.channel("other")
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET channel_id = %s WHERE status = 'rejected'", [other.pk])
        cursor.execute(f"UPDATE {table} SET status = 'approved' WHERE status = 'rejected'")
    assert Reservation.objects.filter(channel=other, status="approved").count() == 1
