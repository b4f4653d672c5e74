"""The scheduler tick: every channel decided, stored, with few queries (docs/scheduling.md)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import time_machine
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django_celery_beat.models import PeriodicTask

from channels_app.models import ChannelTarget
from channels_app.scheduling.beat import TICK_TASK_NAME
from channels_app.scheduling.services import decide_channels
from slotserve_base.dispatch import SCHEDULER_TICK as TICK_TASK
from tests import factories
from tests.clock import T0

HOUR = timedelta(hours=1)


def build(channels: int) -> None:
    owner = factories.user()
    default = factories.preset(factories.llm(), "d")
    booked = factories.preset(factories.llm(), "b")
    node = factories.node(gpus=channels)
    for index in range(channels):
        channel = factories.channel(on=node, default=default, gpu_indexes=[index])
        for k in range(3):
            start = T0 + (2 * k + 1) * HOUR
            factories.reservation(owner=owner, on=channel, start=start, end=start + HOUR, target=booked)
        factories.load(default, channel, started=T0 - HOUR, seconds=20)


def queries_of_a_tick(now: datetime) -> int:
    with CaptureQueriesContext(connection) as captured:
        decide_channels(now=now)
    return len(captured)


@pytest.mark.django_db
def test_query_count_does_not_grow_with_channels():
    build(2)
    small_first = queries_of_a_tick(T0)
    small_steady = queries_of_a_tick(T0 + timedelta(seconds=5))
    build(30)
    large_first = queries_of_a_tick(T0 + timedelta(seconds=10))
    large_steady = queries_of_a_tick(T0 + timedelta(seconds=15))
    assert small_steady == large_steady
    assert small_first == large_first  # the 30 new targets are written in one statement
    assert ChannelTarget.objects.count() == 32


@pytest.mark.django_db
def test_tick_changes_targets_only_when_the_decision_changes():
    build(3)
    assert len(decide_channels(now=T0).changed) == 3
    assert decide_channels(now=T0 + timedelta(seconds=5)).changed == []
    # The first reservation starts at T0 + 1 h; its preload window opens 180 s before.
    assert len(decide_channels(now=T0 + HOUR - timedelta(seconds=180)).changed) == 3
    assert set(ChannelTarget.objects.values_list("reason", flat=True)) == {"preload_next"}


@pytest.mark.django_db
def test_tick_task_runs_through_celery(queued):
    build(1)
    from channels_app.scheduling.tasks import scheduler_tick

    with time_machine.travel(T0 + HOUR + timedelta(minutes=5), tick=False):
        scheduler_tick.delay()
        assert not ChannelTarget.objects.exists()  # queued, not run in place
        assert queued.run() == [TICK_TASK]
    assert ChannelTarget.objects.get().reason == "active_reservation"


@pytest.mark.django_db
def test_beat_runs_the_tick_every_tick_seconds_and_expires_before_the_next(settings):
    settings.SLOTSERVE_TICK_SECONDS = 7
    call_command("migrate", verbosity=0)
    task = PeriodicTask.objects.get(name=TICK_TASK_NAME)
    assert task.task == TICK_TASK
    assert task.interval.every == 7
    assert task.interval.period == "seconds"
    assert task.expire_seconds == 7
    assert task.enabled


@pytest.mark.django_db
def test_a_boundary_before_the_next_tick_is_decided_at_its_moment_not_at_the_tick(settings, monkeypatch):
    """A booking that ends 1.5 s after a tick, with another model booked right after it: the
    tick asks for a re-decision at that very moment (Celery eta), so the next model's load
    starts then rather than up to a tick later."""
    settings.SLOTSERVE_TICK_SECONDS = 5
    owner = factories.user()
    node = factories.node(gpus=1)
    channel = factories.channel(on=node)
    first, second = factories.preset(factories.llm(), "a"), factories.preset(factories.llm(), "b")
    boundary = T0 + timedelta(seconds=1.5)
    factories.reservation(owner=owner, on=channel, start=T0 - HOUR, end=boundary, target=first)
    factories.reservation(owner=owner, on=channel, start=boundary, end=boundary + HOUR, target=second)
    sent: list[tuple[str, dict[str, object]]] = []
    monkeypatch.setattr(
        "channels_app.scheduling.tasks.dispatch.send", lambda name, **options: sent.append((name, options))
    )
    from channels_app.scheduling.tasks import scheduler_tick

    with time_machine.travel(T0, tick=False):
        scheduler_tick()
    assert ChannelTarget.objects.get().valid_until == boundary
    redecide = [options for name, options in sent if name == "channels_app.scheduling.tasks.channel_redecide"]
    assert redecide == [{"args": (channel.pk,), "eta": boundary}]

    sent.clear()  # a boundary beyond the next tick is the next tick's business
    with time_machine.travel(boundary - timedelta(seconds=settings.SLOTSERVE_TICK_SECONDS * 3), tick=False):
        scheduler_tick()
    assert not [name for name, _ in sent if name == "channels_app.scheduling.tasks.channel_redecide"]
