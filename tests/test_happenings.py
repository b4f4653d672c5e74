"""What happened, told once (docs/architecture.md): each fact is one happening, and the
webhooks, a channel's story and the notifications each keep what they name of it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from channels_app.models import ChannelTarget, StoryEntry
from channels_app.node_worker.announce import announce_channel
from channels_app.node_worker.lifecycle import Failure, ProcessState, Tell
from reservations.models import Notification
from reservations.services import reservation_approve, reservation_cancel
from reservations.webhooks.models import Event
from reservations.webhooks.services import webhook_create
from slotserve_base.happenings import Happening, happened
from slotserve_base.target import Target
from slotserve_base.vocabulary import NotificationEvent, Phase, WebhookEvent
from tests import factories
from tests.clock import T0
from tests.receiver import Receiver

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def local_receivers(settings: Any) -> None:
    settings.SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]


@pytest.fixture
def heard() -> Iterator[list[Happening]]:
    """Every happening told while the test runs."""
    told: list[Happening] = []

    def listen(sender: Any, happening: Happening, **_: Any) -> None:
        told.append(happening)

    happened.connect(listen, sender=Happening, dispatch_uid="tests.heard")
    yield told
    happened.disconnect(sender=Happening, dispatch_uid="tests.heard")


def test_an_approval_is_one_happening_that_the_webhooks_and_the_booker_each_keep(heard, ana, staff):
    channel = factories.channel("a100-0")
    booking = factories.reservation(
        owner=ana, on=channel, start=T0 + timedelta(hours=1), end=T0 + timedelta(hours=2), status="pending"
    )
    with Receiver() as receiver:
        webhook_create(owner=ana, url=receiver.url, events=[WebhookEvent.BOOKING_APPROVED])
        reservation_approve(reservation=booking, by=staff, now=T0)
    assert [(h.type, h.data["by"]["username"]) for h in heard] == [("booking.approved", staff.username)]
    assert list(Event.objects.values_list("type", flat=True)) == ["booking.approved"]
    assert list(Notification.objects.filter(user=ana).values_list("event", flat=True)) == [
        NotificationEvent.APPROVED
    ]


def test_the_bookers_own_cancel_is_kept_by_the_webhooks_but_is_no_news_to_them(heard, ana, staff):
    channel = factories.channel("a100-0")
    mine = factories.reservation(
        owner=ana, on=channel, start=T0 + timedelta(hours=1), end=T0 + timedelta(hours=2)
    )
    theirs = factories.reservation(
        owner=ana, on=channel, start=T0 + timedelta(hours=3), end=T0 + timedelta(hours=4)
    )
    reservation_cancel(reservation=mine, by=ana, now=T0)
    reservation_cancel(reservation=theirs, by=staff, now=T0)
    assert [h.type for h in heard] == ["booking.cancelled", "booking.cancelled"]
    told = list(Notification.objects.filter(user=ana).values_list("event", "text"))
    assert told == [(NotificationEvent.CANCELLED, told[0][1])] and f"cancelled by {staff}" in told[0][1]


def test_a_failure_is_one_happening_the_story_keeps_each_time_and_people_hear_once(heard, ana, staff):
    target = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0")
    booking = factories.reservation(
        owner=ana, on=channel, start=T0, end=T0 + timedelta(hours=1), target=target
    )
    row = ChannelTarget.objects.create(
        channel=channel, model=target.model, preset=target, reason="active_reservation", reservation=booking
    )
    running = Target(target.model_id, target.pk)
    loading = ProcessState(phase=Phase.LOADING, running=running)
    failure = Failure(running, 1, T0 + timedelta(seconds=30), "It ran out of memory.", began=T0)
    failed = ProcessState(phase=Phase.FAILED, failure=failure, error="It ran out of memory.")
    with Receiver() as receiver:
        webhook_create(owner=ana, url=receiver.url, events=[WebhookEvent.CHANNEL_FAILED])
        for seconds in (0, 30):  # the first failure of an episode, then its retry failing too
            told = [Tell(WebhookEvent.CHANNEL_FAILED, episode=T0)]
            announce_channel(channel, row, loading, failed, told, None, T0 + timedelta(seconds=seconds))
    assert [h.type for h in heard] == ["channel.failed", "channel.failed"]
    assert StoryEntry.objects.filter(channel=channel, kind="failed").count() == 2
    assert Event.objects.filter(type="channel.failed").count() == 1
    for person in (ana, staff):
        assert list(Notification.objects.filter(user=person).values_list("event", flat=True)) == [
            NotificationEvent.LOAD_FAILED
        ]


def test_a_series_approved_at_once_re_decides_its_channel_once(ana, django_capture_on_commit_callbacks):
    from reservations.services import NewBooking, Repeat, reservation_series_create
    from slotserve_base.dispatch import Redecide, enqueue_redecide

    channel = factories.channel("a100-0", policy="none")
    target = factories.preset(factories.llm("qwen"), "chat")
    with django_capture_on_commit_callbacks() as callbacks:
        booking = NewBooking(
            user=ana, channel=channel, start=T0 + timedelta(hours=1), end=T0 + timedelta(hours=2),
            model=target.model, preset=target,
        )  # fmt: skip
        _, made, _ = reservation_series_create(booking, Repeat("daily", "UTC", count=5), now=T0)
    assert len(made) == 5
    assert [c for c in callbacks if isinstance(c, Redecide)] == [Redecide(channel.pk)], callbacks
    # A re-decision asked in a savepoint rolled back is gone with it; one asked again stands.
    channel = factories.channel("a100-1")
    with django_capture_on_commit_callbacks() as callbacks:
        from django.db import transaction

        try:
            with transaction.atomic():
                enqueue_redecide(channel.pk)
                raise RuntimeError("rolled back")
        except RuntimeError:
            pass
        enqueue_redecide(channel.pk)
    assert [c for c in callbacks if isinstance(c, Redecide)] == [Redecide(channel.pk)]


def test_a_slot_left_is_one_happening_and_its_waiter_is_told_once(heard, ana, bo, staff):
    from reservations.services import waitlist_join

    channel = factories.channel("a100-0")
    taken = factories.reservation(
        owner=ana, on=channel, start=T0 + timedelta(hours=1), end=T0 + timedelta(hours=2)
    )
    waitlist_join(user=bo, channel=channel, start=taken.start, end=taken.end, now=T0)
    reservation_cancel(reservation=taken, by=ana, now=T0)
    assert sorted(h.type for h in heard) == ["booking.cancelled", "waitlist.slot_freed"]
    freed = list(Notification.objects.filter(user=bo).values_list("event", "link"))
    [slot_freed] = [h for h in heard if h.type == "waitlist.slot_freed"]
    assert freed == [(NotificationEvent.SLOT_FREED, slot_freed.link)]


@pytest.mark.django_db(transaction=True)
def test_a_listener_that_swallows_a_failed_transaction_cannot_make_a_booking_look_made(ana):
    """A listener that catches a database failure it cannot recover from (its savepoint could
    not be rolled back, so Django marked the transaction for rollback) would let the booking's
    transaction end in a silent rollback: the booking fails instead of being returned."""
    from django.db import DatabaseError, transaction

    from reservations.models import Reservation
    from reservations.services import NewBooking, reservation_create

    def careless(sender: Any, happening: Happening, **_: Any) -> None:
        # The last listener of the last thing the booking does; marked as a savepoint that could
        # not be rolled back leaves it.
        if happening.type == WebhookEvent.BOOKING_APPROVED:
            transaction.set_rollback(True)

    channel = factories.channel("a100-0")
    target = factories.preset(factories.llm("qwen"), "chat")
    happened.connect(careless, sender=Happening, dispatch_uid="tests.careless")
    try:
        booking = NewBooking(
            user=ana, channel=channel, start=T0 + timedelta(hours=1), end=T0 + timedelta(hours=2),
            model=target.model, preset=target,
        )  # fmt: skip
        with pytest.raises(DatabaseError):
            reservation_create(booking, now=T0)
    finally:
        happened.disconnect(sender=Happening, dispatch_uid="tests.careless")
    assert not Reservation.objects.exists()
