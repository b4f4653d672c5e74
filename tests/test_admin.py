"""The Django admin goes through the services: no status set by hand, every approve, reject,
cancel, booking, move and override notifies and re-decides like the API (docs/security.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.test import Client
from django.utils import timezone

from channels_app.models import ChannelTarget, Override
from reservations.models import Notification, Reservation
from tests import factories
from tests.world import World

# Re-decisions are sent after commit: real transactions.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def staff(db):
    """An admin with every permission of the Django admin."""
    return factories.user("root", staff=True, is_superuser=True)


@pytest.fixture
def admin_client(staff) -> Client:
    client = Client()
    client.force_login(staff)
    return client


@pytest.fixture
def booking(ana):
    target = factories.preset(factories.llm("qwen"), "p")
    channel = factories.channel("ch", default=None)
    now = timezone.now().replace(microsecond=0)  # as the admin's form gives times
    pending = factories.reservation(
        owner=ana,
        on=channel,
        start=now - timedelta(minutes=5),
        end=now + timedelta(hours=1),
        target=target,
        status="pending",
    )
    return World(channel=channel, model=target.model, preset=target, ana=ana, booked=pending, now=now)


def _form(reservation: Reservation, **changes) -> dict[str, str]:
    local = timezone.localtime
    data = {
        "note": reservation.note,
        "start_0": local(reservation.start).strftime("%Y-%m-%d"),
        "start_1": local(reservation.start).strftime("%H:%M:%S"),
        "end_0": local(reservation.end).strftime("%Y-%m-%d"),
        "end_1": local(reservation.end).strftime("%H:%M:%S"),
    }
    data.update(changes)
    return data


def test_status_cannot_be_set_by_hand(admin_client, booking):
    pending = booking.booked
    page = admin_client.get(f"/admin/reservations/reservation/{pending.pk}/change/")
    assert page.status_code == 200
    assert 'name="status"' not in page.content.decode()
    answer = admin_client.post(
        f"/admin/reservations/reservation/{pending.pk}/change/", _form(pending, status="approved")
    )
    assert answer.status_code == 302, answer.context["adminform"].form.errors
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_approve_action_notifies_and_redecides(admin_client, booking, ana, queued):
    pending = booking.booked
    answer = admin_client.post(
        "/admin/reservations/reservation/", {"action": "approve", ACTION_CHECKBOX_NAME: [pending.pk]}
    )
    assert answer.status_code == 302
    queued.run()
    pending.refresh_from_db()
    assert pending.status == "approved" and pending.reviewed_by is not None
    assert Notification.objects.filter(user=ana, event="approved").exists()
    target = ChannelTarget.objects.get(channel=booking.channel)
    assert target.reservation_id == pending.pk and target.reason == "active_reservation"


def test_reject_action_asks_for_a_reason_then_rejects_and_notifies(admin_client, booking, ana):
    pending = booking.booked
    asked = admin_client.post(
        "/admin/reservations/reservation/", {"action": "reject", ACTION_CHECKBOX_NAME: [pending.pk]}
    )
    assert asked.status_code == 200 and 'name="reason"' in asked.content.decode()
    pending.refresh_from_db()
    assert pending.status == "pending"
    done = admin_client.post(
        "/admin/reservations/reservation/",
        {"action": "reject", ACTION_CHECKBOX_NAME: [pending.pk], "reason": "maintenance that week"},
    )
    assert done.status_code == 302
    pending.refresh_from_db()
    assert pending.status == "rejected" and pending.reject_reason == "maintenance that week"
    assert "maintenance that week" in Notification.objects.get(user=ana, event="rejected").text


def test_cancel_action_goes_through_the_transition_rules(admin_client, booking, ana):
    now = booking.now
    future = factories.reservation(
        owner=ana,
        on=booking.channel,
        start=now + timedelta(hours=2),
        end=now + timedelta(hours=3),
        target=booking.preset,
        status="approved",
    )
    admin_client.post(
        "/admin/reservations/reservation/", {"action": "cancel", ACTION_CHECKBOX_NAME: [future.pk]}
    )
    future.refresh_from_db()
    assert future.status == "cancelled"
    assert Notification.objects.filter(user=ana, event="cancelled").exists()
    # A reservation that is over cannot be cancelled: a message, not a change.
    past = factories.reservation(
        owner=ana,
        on=booking.channel,
        start=now - timedelta(hours=3),
        end=now - timedelta(hours=2),
        target=booking.preset,
        status="approved",
    )
    answer = admin_client.post(
        "/admin/reservations/reservation/",
        {"action": "cancel", ACTION_CHECKBOX_NAME: [past.pk]},
        follow=True,
    )
    past.refresh_from_db()
    assert past.status == "approved"
    assert "cannot cancel" in answer.content.decode()


def test_adding_an_overlapping_reservation_is_a_form_error_on_every_database(admin_client, booking, bo):
    pending = booking.booked
    before = Reservation.objects.count()
    start, end = pending.end - timedelta(minutes=30), pending.end + timedelta(minutes=30)
    data = {
        "user": str(bo.pk),
        "channel": str(booking.channel.pk),
        "model": str(booking.preset.model_id),
        "preset": str(booking.preset.pk),
        "start_0": start.strftime("%Y-%m-%d"),
        "start_1": start.strftime("%H:%M:%S"),
        "end_0": end.strftime("%Y-%m-%d"),
        "end_1": end.strftime("%H:%M:%S"),
    }
    answer = admin_client.post("/admin/reservations/reservation/add/", data)
    assert answer.status_code == 200  # the form again, with the reason
    assert "overlaps reservation" in answer.content.decode()
    assert Reservation.objects.count() == before


def test_adding_through_the_admin_books_for_the_user_approved_and_redecides(admin_client, booking, bo, staff):
    now = booking.now
    data = {
        "user": str(bo.pk),
        "channel": str(booking.channel.pk),
        "model": str(booking.preset.model_id),
        "preset": str(booking.preset.pk),
        "note": "for the demo",
        "start_0": (now + timedelta(hours=2)).strftime("%Y-%m-%d"),
        "start_1": (now + timedelta(hours=2)).strftime("%H:%M:%S"),
        "end_0": (now + timedelta(hours=3)).strftime("%Y-%m-%d"),
        "end_1": (now + timedelta(hours=3)).strftime("%H:%M:%S"),
    }
    answer = admin_client.post("/admin/reservations/reservation/add/", data)
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    made = Reservation.objects.get(user=bo)
    assert made.status == "approved" and made.reviewed_by == staff and made.note == "for the demo"


def test_moving_a_reservation_checks_overlap_and_tells_the_owner(admin_client, booking, ana, bo):
    now = booking.now
    other = factories.reservation(
        owner=bo,
        on=booking.channel,
        start=now + timedelta(hours=2),
        end=now + timedelta(hours=3),
        target=booking.preset,
        status="approved",
    )
    onto = {
        "end_0": (now + timedelta(hours=2, minutes=30)).strftime("%Y-%m-%d"),
        "end_1": (now + timedelta(hours=2, minutes=30)).strftime("%H:%M:%S"),
    }
    pending = booking.booked
    refused = admin_client.post(
        f"/admin/reservations/reservation/{pending.pk}/change/", _form(pending, **onto)
    )
    assert refused.status_code == 200 and "overlaps reservation" in refused.content.decode()
    pending.refresh_from_db()
    assert pending.end == now + timedelta(hours=1)
    later = now + timedelta(hours=1, minutes=30)
    moved = admin_client.post(
        f"/admin/reservations/reservation/{other.pk}/change/",
        _form(other, start_0=later.strftime("%Y-%m-%d"), start_1=later.strftime("%H:%M:%S")),
    )
    assert moved.status_code == 302
    other.refresh_from_db()
    assert abs((other.start - later).total_seconds()) < 1
    assert Notification.objects.filter(user=bo, event="changed").exists()


def test_reservations_cannot_be_deleted_in_the_admin(admin_client, booking):
    pending = booking.booked
    answer = admin_client.post(f"/admin/reservations/reservation/{pending.pk}/delete/", {"post": "yes"})
    assert answer.status_code == 403
    assert Reservation.objects.filter(pk=pending.pk).exists()


def test_override_saved_in_the_admin_redecides_and_is_validated(admin_client, booking, queued):
    channel, target = booking.channel, booking.preset
    booking.booked.delete()
    until = timezone.now() + timedelta(hours=1)
    data = {
        "channel": str(channel.pk),
        "model": str(target.model_id),
        "preset": str(target.pk),
        "until_0": until.strftime("%Y-%m-%d"),
        "until_1": until.strftime("%H:%M:%S"),
    }
    other_model = factories.llm("other")
    refused = admin_client.post("/admin/channels_app/override/add/", {**data, "model": str(other_model.pk)})
    assert refused.status_code == 200 and "belongs to model" in refused.content.decode()
    assert not Override.objects.exists()
    answer = admin_client.post("/admin/channels_app/override/add/", data)
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    queued.run()
    assert ChannelTarget.objects.get(channel=channel).reason == "manual_override"
    override = Override.objects.get(channel=channel)
    admin_client.post(f"/admin/channels_app/override/{override.pk}/delete/", {"post": "yes"})
    queued.run()
    assert not Override.objects.exists()
    assert ChannelTarget.objects.get(channel=channel).reason != "manual_override"


def test_the_admin_index_keeps_slotserves_internals_apart_at_the_end(admin_client):
    """Staff see what they manage first; the periodic jobs, runtimes, load records, lock-outs
    and deliveries SlotServe keeps for itself sit together, last, under "Internals"."""
    page = admin_client.get("/admin/").content.decode()
    internals = page.index("Internals (kept by SlotServe")
    for kept in ("Periodic tasks", "Channel runtimes", "Load records", "Access attempts", "Deliveries"):
        assert page.index(kept) > internals, kept
    for managed in ("Channels", "Reservations", "API keys", "Webhooks"):
        assert page.index(managed) < internals, managed
    # An internal model's own page is where it was.
    assert admin_client.get("/admin/django_celery_beat/periodictask/").status_code == 200
