"""Decisions never wait behind other work: a booking's re-decision and the scheduler's tick go to
a queue of their own, taken by a worker that does nothing else, one task at a time
(docs/scheduling.md, "Decisions first")."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from channels_app.models import ChannelTarget
from reservations.services import NewBooking, reservation_create
from slotserve_base import dispatch
from slotserve_site.celery import app as celery_app
from slotserve_site.running.parts import decisions_command, scheduler_command
from tests import factories
from tests.clock import eventually
from tests.queued import worker


def _booking_soon(user, channel):
    start = (timezone.now() + timedelta(minutes=1)).replace(microsecond=0)
    return NewBooking(user=user, channel=channel, start=start, end=start + timedelta(hours=1), exclusive=True)


@pytest.mark.django_db
def test_a_bookings_redecision_is_queued_for_the_decisions_worker_not_behind_the_long_jobs(
    ana, queued, django_capture_on_commit_callbacks
):
    channel = factories.channel("a100-0")
    with django_capture_on_commit_callbacks(execute=True):
        reservation_create(_booking_soon(ana, channel), now=timezone.now())
    dispatch.send(dispatch.CATCH_UP_USAGE)  # a long job: the scheduler's own queue
    assert queued.queues() == {
        dispatch.decisions_queue(): [dispatch.CHANNEL_REDECIDE],
        celery_app.conf.task_default_queue: [dispatch.CATCH_UP_USAGE],
    }


def test_beats_tick_goes_to_the_decisions_queue(queued):
    # What beat does with an entry that names no queue (django-celery-beat's PeriodicTask).
    celery_app.send_task(dispatch.SCHEDULER_TICK)
    assert queued.queues() == {dispatch.decisions_queue(): [dispatch.SCHEDULER_TICK]}


@pytest.mark.django_db(transaction=True)
def test_a_booking_is_decided_while_the_schedulers_worker_is_busy(ana):
    # The scheduler's queue holds a long job and nobody takes it (its worker busy); the
    # decisions' worker alone decides the booked channel.
    dispatch.send(dispatch.CATCH_UP_USAGE)
    channel = factories.channel("a100-0")
    with worker(dispatch.decisions_queue()):
        booking = reservation_create(_booking_soon(ana, channel), now=timezone.now())

        def decided() -> bool:
            return ChannelTarget.objects.filter(channel=channel, reservation=booking).exists()

        assert eventually(decided, timeout=10, every=0.05)


def test_the_one_command_start_runs_decisions_on_a_worker_of_their_own():
    decisions, scheduler = decisions_command(), scheduler_command()
    assert decisions[decisions.index("--queues") + 1] == dispatch.decisions_queue()
    # One task taken at a time: a tick never holds a re-decision behind it in a process's prefetch.
    assert decisions[decisions.index("--prefetch-multiplier") + 1] == "1"
    assert "--beat" not in decisions
    assert scheduler[scheduler.index("--queues") + 1] == celery_app.conf.task_default_queue
