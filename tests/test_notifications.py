"""Each notification reaches the inbox and the mail outbox exactly once, respecting preferences."""

from __future__ import annotations

import html
from datetime import UTC, datetime, time, timedelta

import pytest
from django.core import mail
from django.utils import timezone

from reservations.models import Notification, ReservationStatus
from reservations.notifications import notify
from reservations.profiles import profile_for
from reservations.services import reservation_approve
from reservations.tasks import send_starting_soon_reminders
from slotserve_base.dispatch import NOTIFICATION_EMAIL
from slotserve_base.vocabulary import Phase
from tests import factories
from tests.clock import T0
from tests.factories import client_for, in_zone, iso
from tests.world import World

HOUR = timedelta(hours=1)


@pytest.fixture
def world(db, frozen):
    target = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("ch", policy="all")
    return World(channel=channel, model=target.model, preset=target)


def book(client, world, start, end):
    answer = client.post(
        "/api/reservations/",
        {
            "channel": world.channel.pk,
            "start": iso(start),
            "end": iso(end),
            "model": world.preset.model_id,
            "preset": world.preset.pk,
        },
    )
    assert answer.status_code == 201, answer.data
    return answer.data


def mails_to(address: str) -> list[str]:
    """The events of the mails to ``address``: their subjects up to the channel and slot."""
    return [str(m.subject).split(":")[0] for m in mail.outbox if address in m.to]


def test_submitted_approved_rejected_cancelled_each_once(
    world, ana, staff, ana_api, staff_api, django_capture_on_commit_callbacks, queued
):
    with django_capture_on_commit_callbacks(execute=True):
        first = book(ana_api, world, T0 + HOUR, T0 + 2 * HOUR)
        second = book(ana_api, world, T0 + 3 * HOUR, T0 + 4 * HOUR)
        staff_api.post(f"/api/reservations/{first['id']}/approve")
        staff_api.post(f"/api/reservations/{first['id']}/approve")  # a second click changes nothing
        staff_api.post(f"/api/reservations/{second['id']}/reject", {"reason": "maintenance"})
        staff_api.post(f"/api/reservations/{first['id']}/cancel")
    # The emails wait on the queue, sent by a worker, never in the request.
    assert not mail.outbox and queued.names().count(NOTIFICATION_EMAIL) == 5
    queued.run()
    assert sorted(Notification.objects.filter(user=staff).values_list("event", flat=True)) == [
        "submitted",
        "submitted",
    ]
    assert sorted(Notification.objects.filter(user=ana).values_list("event", flat=True)) == [
        "approved",
        "cancelled",
        "rejected",
    ]
    assert "maintenance" in Notification.objects.get(user=ana, event="rejected").text
    assert sorted(mails_to(ana.email)) == [
        "[SlotServe] approved",
        "[SlotServe] cancelled",
        "[SlotServe] rejected",
    ]
    assert mails_to(staff.email) == ["[SlotServe] submitted", "[SlotServe] submitted"]


def test_email_preference_off_keeps_the_inbox(world, ana, django_capture_on_commit_callbacks, queued):
    profile = profile_for(ana)
    profile.email_events = {"approved": False}
    profile.save()
    with django_capture_on_commit_callbacks(execute=True):
        notify(user=ana, event="approved", text="yes", key="k1")
        notify(user=ana, event="rejected", text="no", key="k2")
    queued.run()
    assert Notification.objects.filter(user=ana).count() == 2
    assert mails_to(ana.email) == ["[SlotServe] rejected"]


def test_starting_soon_is_sent_once_however_often_the_tick_runs(
    world, ana, frozen, django_capture_on_commit_callbacks, queued
):
    world.channel.approval_policy = "none"
    world.channel.save()
    factories.reservation(
        owner=ana, on=world.channel, start=T0 + HOUR, end=T0 + 2 * HOUR, target=world.preset
    )
    with django_capture_on_commit_callbacks(execute=True):
        frozen.move_to(T0 + HOUR - timedelta(minutes=16))
        send_starting_soon_reminders()
        assert not Notification.objects.filter(event="starting_soon").exists()
        for minutes in (15, 10, 5, 1):
            frozen.move_to(T0 + HOUR - timedelta(minutes=minutes))
            send_starting_soon_reminders()
    queued.run()
    notes = Notification.objects.filter(user=ana, event="starting_soon")
    # Its slot, in ana's zone (UTC here): when, not only how soon.
    slot = "Mon 7 Dec 09:00–10:00 UTC"
    assert [n.text for n in notes] == [f"Your reservation of ch starts in 15 minutes: {slot}."]
    assert mails_to(ana.email) == ["[SlotServe] starting soon"]


def test_ended_early_by_staff_is_told_to_the_booker(world, ana, staff, staff_api, frozen):
    world.channel.approval_policy = "none"
    world.channel.save()
    active = factories.reservation(
        owner=ana, on=world.channel, start=T0 - HOUR, end=T0 + HOUR, target=world.preset
    )
    assert staff_api.post(f"/api/reservations/{active.pk}/end").data["status"] == "ended"
    assert list(Notification.objects.filter(user=ana).values_list("event", flat=True)) == ["ended_early"]


def test_inbox_api_reads_only_your_own(world, ana, bo, ana_api, bo_api):
    mine = notify(user=ana, event="approved", text="yours")
    assert mine is not None
    assert [n["text"] for n in ana_api.get("/api/notifications/", {"unread": "true"}).data] == ["yours"]
    assert bo_api.get("/api/notifications/").data == []
    assert bo_api.post(f"/api/notifications/{mine.pk}/read").status_code == 404
    assert ana_api.post(f"/api/notifications/{mine.pk}/read").data["read"] is True
    assert ana_api.get("/api/notifications/", {"unread": "true"}).data == []


def test_emails_link_to_the_booking_or_the_approvals_at_the_portals_public_address(
    world, ana, staff, ana_api, staff_api, settings, django_capture_on_commit_callbacks, queued
):
    settings.SLOTSERVE_PUBLIC_URL = "https://gpu.lab.example"
    with django_capture_on_commit_callbacks(execute=True):
        made = book(ana_api, world, T0 + HOUR, T0 + 2 * HOUR)
        staff_api.post(f"/api/reservations/{made['id']}/approve")
    queued.run()
    (asked,) = [m for m in mail.outbox if staff.email in m.to]
    assert f"https://gpu.lab.example/approvals/#reservation-{made['id']}" in asked.body
    (approved,) = [m for m in mail.outbox if ana.email in m.to]
    assert "https://gpu.lab.example/reservations/" in approved.body


def test_without_a_public_address_an_email_carries_no_link_it_cannot_make_whole(
    world, ana, staff, ana_api, staff_api, settings, django_capture_on_commit_callbacks, queued
):
    settings.SLOTSERVE_PUBLIC_URL = ""
    with django_capture_on_commit_callbacks(execute=True):
        made = book(ana_api, world, T0 + HOUR, T0 + 2 * HOUR)
        staff_api.post(f"/api/reservations/{made['id']}/approve")
    queued.run()
    assert mail.outbox and not any("/reservations/" in m.body or "/approvals/" in m.body for m in mail.outbox)


@pytest.mark.django_db
def test_the_admins_told_of_a_bookings_failure_hear_of_its_recovery_too(ana, staff):
    """docs/scheduling.md: each episode tells the booker and the admins once of its first
    failure, its fallback and its recovery; every failure is in the channel's story."""
    from channels_app.models import ChannelTarget, StoryEntry
    from channels_app.node_worker.announce import announce_channel
    from channels_app.node_worker.lifecycle import Failure, ProcessState, Tell
    from slotserve_base.target import Target
    from slotserve_base.vocabulary import NotificationEvent, WebhookEvent

    target = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0")
    booking = factories.reservation(
        owner=ana, on=channel, start=T0 - timedelta(minutes=5), end=T0 + timedelta(hours=1), target=target
    )
    row = ChannelTarget.objects.create(
        channel=channel, model=target.model, preset=target, reason="active_reservation", reservation=booking
    )
    running = Target(target.model_id, target.pk)
    loading = ProcessState(phase=Phase.LOADING, running=running)
    failed = ProcessState(
        phase=Phase.FAILED, failure=Failure(running, 1, T0, "out of memory", began=T0), error="out of memory"
    )
    for when in (T0, T0 + timedelta(minutes=1)):  # two failures of one episode
        announce_channel(
            channel, row, loading, failed, [Tell(WebhookEvent.CHANNEL_FAILED, episode=T0)], None, when
        )
    ready = ProcessState(phase=Phase.READY, running=running)
    announce_channel(
        channel, row, loading, ready, [Tell(WebhookEvent.CHANNEL_RECOVERED, episode=T0)], None, T0
    )
    for person in (ana, staff):
        told = list(Notification.objects.filter(user=person).values_list("event", "text"))
        assert sorted(event for event, _ in told) == [
            NotificationEvent.LOAD_FAILED,
            NotificationEvent.RECOVERED,
        ]
        assert any(text.startswith("a100-0: out of memory. (ana's booking of a100-0") for _, text in told), (
            told
        )
    assert StoryEntry.objects.filter(channel=channel, kind="failed").count() == 2


def tomorrow_at(hour: int) -> datetime:
    day = (timezone.localtime() + timedelta(days=1)).date()
    return datetime.combine(day, time(hour), tzinfo=timezone.get_current_timezone())


@pytest.mark.django_db(transaction=True)
def test_emails_name_the_channel_and_the_time_in_their_subject(django_capture_on_commit_callbacks, queued):
    staff = factories.user("boss", staff=True)
    ana = factories.user("ana")
    channels = [factories.channel("a100-0"), factories.channel("a100-1")]
    start = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(days=1)
    made = [
        factories.reservation(
            owner=ana,
            on=channels[0],
            start=start,
            end=start + timedelta(hours=2),
            status=ReservationStatus.PENDING,
        ),
        factories.reservation(
            owner=ana,
            on=channels[1],
            start=start,
            end=start + timedelta(hours=2),
            status=ReservationStatus.PENDING,
        ),
        factories.reservation(
            owner=ana,
            on=channels[0],
            start=start + timedelta(hours=3),
            end=start + timedelta(hours=4),
            status=ReservationStatus.PENDING,
        ),
    ]
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        for booking in made:
            reservation_approve(reservation=booking, by=staff, now=timezone.now())
    queued.run()
    subjects = [str(m.subject) for m in mail.outbox if ana.email in m.to]
    assert len(subjects) == 3 and len(set(subjects)) == 3, subjects
    for subject, booking in zip(subjects, made, strict=True):
        local = timezone.localtime(booking.start)  # its own day: the third may begin after midnight
        assert subject.startswith("[SlotServe] approved: "), subject
        assert booking.channel.name in subject, subject
        assert f"{local:%H:%M}" in subject
        assert f"{local.day} {local:%b}" in subject


@pytest.mark.django_db(transaction=True)
def test_a_channels_news_names_the_booking_by_its_channel_and_time_not_its_number():
    from reservations.notices import reservation_summary

    ana = factories.user("ana")
    channel = factories.channel("a100-0")
    start = tomorrow_at(10)
    booking = factories.reservation(owner=ana, on=channel, start=start, end=start + timedelta(hours=2))
    said = reservation_summary(booking, timezone.get_default_timezone())
    assert f"reservation {booking.pk}" not in said
    assert "ana's booking" in said and "10:00" in said


@pytest.mark.django_db
def test_notifications_and_errors_speak_in_the_readers_zone(frozen, ana, staff):
    from reservations import services

    in_zone(ana, "Europe/Berlin")
    in_zone(staff, "Asia/Shanghai")
    chat = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0", policy="all")
    asked = services.reservation_create(
        services.NewBooking(
            user=ana, channel=channel, start=T0 + 24 * HOUR, end=T0 + 26 * HOUR, model=chat.model, preset=chat
        ),
        now=T0,
    )
    to_staff = Notification.objects.get(user=staff, event="submitted")
    assert to_staff.text == "ana asks for a100-0, Tue 8 Dec 16:00–18:00 CST."
    assert to_staff.link == f"/approvals/#reservation-{asked.pk}"
    services.reservation_approve(reservation=asked, by=staff, now=T0)
    to_ana = Notification.objects.get(user=ana, event="approved")
    assert to_ana.text == "Your reservation of a100-0, Tue 8 Dec 09:00–11:00 CET, is approved."
    assert "T08:00:00Z" not in to_ana.text
    # A conflict, as the Berlin user submitting reads it.
    refused = client_for(ana).post(
        "/book/",
        {
            "channel": channel.pk,
            "start": "2026-12-08T10:00",
            "end": "2026-12-08T12:00",
            "model": chat.model_id,
            "preset": chat.pk,
        },
    )
    assert "ana's, Tue 8 Dec 09:00–11:00 CET, approved" in html.unescape(refused.content.decode())


@pytest.mark.django_db(transaction=True)
def test_a_ready_model_and_an_expiring_key_name_their_channel_slot_and_key_in_the_mail(
    ana, queued, django_capture_on_commit_callbacks
):
    """Mails read in an inbox: "model ready" says which channel and slot, "key expiring" which key."""
    from channels_app.models import ChannelTarget
    from channels_app.node_worker.announce import announce_channel
    from channels_app.node_worker.lifecycle import ProcessState, Tell
    from gateway.api_keys import api_key_create, tell_keys_expiring
    from gateway.models import ApiKey
    from slotserve_base.target import Target
    from slotserve_base.vocabulary import WebhookEvent

    profile = profile_for(ana)
    profile.email_events = {"model_ready": True, "key_expiring": True}
    profile.save()
    target = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0")
    now = timezone.now()
    booking = factories.reservation(
        owner=ana, on=channel, start=now - timedelta(minutes=1), end=now + timedelta(hours=1), target=target
    )
    row = ChannelTarget.objects.create(
        channel=channel, model=target.model, preset=target, reason="active_reservation", reservation=booking
    )
    running = Target(target.model_id, target.pk)
    loading, ready = (
        ProcessState(phase=Phase.LOADING, running=running),
        ProcessState(phase=Phase.READY, running=running),
    )
    key, _ = api_key_create(user=ana, name="notebook", expires_at=now + timedelta(days=3))
    ApiKey.objects.filter(pk=key.pk).update(created=now - timedelta(days=60))
    with django_capture_on_commit_callbacks(execute=True):
        announce_channel(channel, row, loading, ready, [Tell(WebhookEvent.CHANNEL_READY)], None, now)
        tell_keys_expiring(now=now)
    queued.run()
    subjects = sorted(str(m.subject) for m in mail.outbox if ana.email in m.to)
    slot = booking.start.astimezone(UTC)
    assert len(subjects) == 2, subjects
    assert subjects[0].startswith("[SlotServe] key expiring: notebook (") and "…)" in subjects[0]
    assert subjects[1].startswith("[SlotServe] model ready: a100-0, ") and f"{slot:%H:%M}" in subjects[1]
