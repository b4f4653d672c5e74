"""Changing what is booked: move, shorten, retarget — the same checks as booking, a new approval
where the policy asks for one, and one winner when a change races a new booking."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from channels_app.models import Preset
from reservations.models import Notification, Reservation
from tests import factories
from tests.factories import iso
from tests.test_concurrency import _race
from tests.world import World

HOUR = timedelta(hours=1)


@pytest.fixture
def setup(db, ana, bo, staff):
    qwen = factories.llm("qwen")
    chat = factories.preset(qwen, "chat")
    llama = factories.llm("llama")
    open_channel = factories.channel("open-0")
    strict = factories.channel("strict-0", policy="all")
    start = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    factories.preset(qwen, "long")
    return World(channel=open_channel, model=qwen, preset=chat, other=strict, other_model=llama, start=start)


def longer(world: World) -> Preset:
    """qwen's second preset, "long"."""
    return Preset.objects.get(model=world.model, name="long")


def api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_the_owner_moves_and_retargets_a_booking_with_the_booking_checks(setup, ana, bo):
    s = setup
    mine = factories.reservation(
        owner=ana, on=s.channel, start=s.start, end=s.start + 2 * HOUR, target=s.preset
    )
    factories.reservation(
        owner=bo, on=s.channel, start=s.start + 4 * HOUR, end=s.start + 5 * HOUR, target=s.preset
    )
    moved = api(ana).post(
        f"/api/reservations/{mine.pk}/change",
        {"start": iso(s.start + HOUR), "end": iso(s.start + 3 * HOUR), "preset": longer(s).pk},
        format="json",
    )
    assert moved.status_code == 200, moved.data
    assert (moved.data["status"], moved.data["preset"]) == ("approved", longer(s).pk)
    mine.refresh_from_db()
    assert (mine.start, mine.end) == (s.start + HOUR, s.start + 3 * HOUR)
    clash = api(ana).post(
        f"/api/reservations/{mine.pk}/change", {"end": iso(s.start + 5 * HOUR)}, format="json"
    )
    assert clash.status_code == 409 and "bo's" in clash.data["message"]
    other_model = api(ana).post(
        f"/api/reservations/{mine.pk}/change", {"model": "llama", "preset": None}, format="json"
    )
    assert other_model.status_code == 200 and other_model.data["model"] == s.other_model.pk
    wrong = api(ana).post(
        f"/api/reservations/{mine.pk}/change", {"model": "llama", "preset": s.preset.pk}, format="json"
    )
    assert wrong.status_code == 400 and "preset" in str(wrong.data)
    nothing = api(ana).post(f"/api/reservations/{mine.pk}/change", {}, format="json")
    assert nothing.status_code == 400
    assert (
        api(bo).post(f"/api/reservations/{mine.pk}/change", {"note": "x"}, format="json").status_code == 404
    )
    too_long = api(ana).post(
        f"/api/reservations/{mine.pk}/change", {"end": iso(s.start + 30 * HOUR)}, format="json"
    )
    assert too_long.status_code == 400 and "end" in too_long.data


def test_approval_again_where_the_policy_asks_and_never_for_shortening(setup, ana, staff):
    s = setup
    booking = factories.reservation(
        owner=ana, on=s.other, start=s.start, end=s.start + 3 * HOUR, target=s.preset
    )
    shorter = api(ana).post(
        f"/api/reservations/{booking.pk}/change", {"end": iso(s.start + 2 * HOUR)}, format="json"
    )
    assert shorter.data["status"] == "approved"
    later = api(ana).post(
        f"/api/reservations/{booking.pk}/change",
        {"start": iso(s.start + 5 * HOUR), "end": iso(s.start + 6 * HOUR)},
        format="json",
    )
    assert later.data["status"] == "pending"
    asked = Notification.objects.get(
        user=staff, event="submitted", link=f"/approvals/#reservation-{booking.pk}"
    )
    assert "asks for strict-0" in asked.text
    api(staff).post(f"/api/reservations/{booking.pk}/approve")
    retarget = api(ana).post(
        f"/api/reservations/{booking.pk}/change", {"preset": longer(s).pk}, format="json"
    )
    assert retarget.data["status"] == "pending"
    # Staff change it for her: no approval needed, and she is told.
    api(staff).post(f"/api/reservations/{booking.pk}/approve")
    by_staff = api(staff).post(
        f"/api/reservations/{booking.pk}/change", {"end": iso(s.start + 7 * HOUR)}, format="json"
    )
    assert by_staff.data["status"] == "approved"
    assert Notification.objects.filter(user=ana, event="changed").exists()


def test_a_started_booking_keeps_its_start_and_cannot_end_in_the_past(setup, ana):
    s = setup
    now = timezone.now()
    running = factories.reservation(
        owner=ana, on=s.channel, start=now - HOUR, end=now + HOUR, target=s.preset
    )
    moved = api(ana).post(f"/api/reservations/{running.pk}/change", {"start": iso(now + HOUR)}, format="json")
    assert moved.status_code == 400 and "start" in moved.data
    past = api(ana).post(
        f"/api/reservations/{running.pk}/change", {"end": iso(now - timedelta(minutes=5))}, format="json"
    )
    assert past.status_code == 400 and "end the reservation now instead" in str(past.data)
    shorter = api(ana).post(
        f"/api/reservations/{running.pk}/change", {"end": iso(now + timedelta(minutes=30))}, format="json"
    )
    assert shorter.status_code == 200
    running.refresh_from_db()
    assert running.start == (now - HOUR).replace(microsecond=running.start.microsecond)


def test_the_change_page_in_the_portal(setup, ana):
    from django.test import Client

    s = setup
    booking = factories.reservation(
        owner=ana, on=s.channel, start=s.start, end=s.start + HOUR, target=s.preset
    )
    client = Client()
    client.force_login(ana)
    page = client.get(f"/reservations/{booking.pk}/change")
    assert page.status_code == 200 and "Change your booking of open-0" in page.content.decode()
    local = timezone.localtime(s.start)
    answer = client.post(
        f"/reservations/{booking.pk}/change",
        {
            "start": local.strftime("%Y-%m-%dT%H:%M"),
            "end": (local + 2 * HOUR).strftime("%Y-%m-%dT%H:%M"),
            "model": s.model.pk,
            "preset": s.preset.pk,
            "note": "longer",
        },
    )
    assert answer.status_code == 302
    booking.refresh_from_db()
    assert (booking.end, booking.note) == (s.start + 2 * HOUR, "longer")
    assert f'href="/reservations/{booking.pk}/change"' in client.get("/reservations/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_move_racing_a_new_booking_of_the_same_time_exactly_one_wins():
    qwen = factories.llm("qwen")
    chat = factories.preset(qwen, "chat")
    channel = factories.channel("contested")
    mover, booker = factories.user("mover"), factories.user("booker")
    start = (timezone.now() + timedelta(days=1)).replace(microsecond=0)
    booking = factories.reservation(owner=mover, on=channel, start=start, end=start + HOUR, target=chat)
    wanted = (start + 3 * HOUR, start + 4 * HOUR)

    def move() -> int:
        return (
            api(mover)
            .post(
                f"/api/reservations/{booking.pk}/change",
                {"start": iso(wanted[0]), "end": iso(wanted[1])},
                format="json",
            )
            .status_code
        )

    def book() -> int:
        return (
            api(booker)
            .post(
                "/api/reservations/",
                {
                    "channel": channel.pk,
                    "start": iso(wanted[0]),
                    "end": iso(wanted[1]),
                    "model": qwen.pk,
                    "preset": chat.pk,
                },
                format="json",
            )
            .status_code
        )

    for _ in range(3):
        statuses = sorted(_race([move, book]))
        assert statuses in ([200, 409], [201, 409]), statuses
        holders = Reservation.objects.blocking().filter(channel=channel, start=wanted[0])
        assert holders.count() == 1
        # Reset for the next round.
        Reservation.objects.filter(user=booker).delete()
        Reservation.objects.filter(pk=booking.pk).update(start=start, end=start + HOUR)


@pytest.mark.django_db
@pytest.mark.parametrize("edit", ["model", "preset"])
def test_a_model_or_preset_edit_re_decides_at_once(
    staff_api, edit, django_capture_on_commit_callbacks, queued
):
    """A booking 20 minutes ahead is outside a small model's preload window; made large (its
    load estimate grows past 20 minutes), the channel starts preloading it at once, not at the
    next tick. A preset edit (here: none to the same) re-decides the channels that use it too."""
    from channels_app.models import ChannelTarget
    from channels_app.scheduling.services import decide_channels

    owner = factories.user()
    small = factories.llm("growing", size=10**9)
    chat = factories.preset(small, "chat")
    channel = factories.channel(on=factories.node(gpus=1))
    start = timezone.now() + timedelta(minutes=20)
    factories.reservation(owner=owner, on=channel, start=start, end=start + timedelta(hours=1), target=chat)
    decide_channels(now=timezone.now())
    assert ChannelTarget.objects.get(channel=channel).reason != "preload_next"
    with django_capture_on_commit_callbacks(execute=True):
        if edit == "model":
            answer = staff_api.patch(f"/api/models/{small.pk}/", {"size_bytes": 400 * 10**9}, format="json")
        else:
            small.size_bytes = 400 * 10**9
            small.save()  # a change the scheduler has not seen yet
            answer = staff_api.patch(f"/api/presets/{chat.pk}/", {"args": "-c 4096"}, format="json")
    queued.run()
    assert answer.status_code == 200, answer.content
    assert ChannelTarget.objects.get(channel=channel).reason == "preload_next"
