"""Blackouts and bulletins: staff close channels for a time with a reason every refusal
quotes, and say something on everyone's overview (docs/portal.md, "Blackouts and bulletins")."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine

from reservations.models import Blackout, Bulletin, Notification, Reservation, ReservationStatus
from reservations.rules import Closure, closure_over
from reservations.services.common import closed_words
from tests import factories
from tests.clock import T0
from tests.factories import iso
from tests.world import World

HOUR = timedelta(hours=1)
FIRMWARE = "firmware update on node-a"


@pytest.mark.parametrize(
    ("start", "end", "refused"),
    [
        (T0, T0 + HOUR, None),  # ends where the blackout begins
        (T0 + 3 * HOUR, T0 + 4 * HOUR, None),  # begins where it ends
        (T0 + HOUR, T0 + 2 * HOUR, "channel gpu-a is closed Mon 7 Dec 09:00–11:00 UTC: " + FIRMWARE),
        (T0, T0 + 8 * HOUR, "channel gpu-a is closed Mon 7 Dec 09:00–11:00 UTC: " + FIRMWARE),
        (T0 + 2 * HOUR, T0 + 6 * HOUR, "channel gpu-a is closed Mon 7 Dec 09:00–11:00 UTC: " + FIRMWARE),
    ],
)
def test_a_slot_that_overlaps_a_blackout_is_refused_with_its_time_and_reason(start, end, refused):
    closures = [
        Closure(T0 + 5 * HOUR, T0 + 7 * HOUR, "later"),  # the earliest one that overlaps is named
        Closure(T0 + HOUR, T0 + 3 * HOUR, FIRMWARE),
    ]
    closed = closure_over(start=start, end=end, closures=closures)
    assert (None if closed is None else closed_words("gpu-a", closed)) == refused


@pytest.fixture
def world(db):
    with time_machine.travel(T0, tick=False):
        target = factories.preset(factories.llm("qwen"), "chat")
        gpu_a = factories.channel(
            "gpu-a", default=target, on=factories.node("node-a", backends=["llama.cpp"])
        )
        gpu_b = factories.channel(
            "gpu-b", default=target, on=factories.node("node-b", backends=["llama.cpp"])
        )
        yield World(channel=gpu_a, other=gpu_b, model=target.model, preset=target)


def book(api, channel, start, end, model="qwen"):
    return api.post(
        "/api/reservations/", {"channel": channel, "start": iso(start), "end": iso(end), "model": model}
    )


def close(api, start, end, channels=(), reason=FIRMWARE, **more):
    return api.post(
        "/api/blackouts/",
        {"channels": list(channels), "start": iso(start), "end": iso(end), "reason": reason, **more},
        format="json",
    )


def test_nobody_books_into_a_blackout_not_even_staff(world, frozen, ana_api, staff_api):
    made = close(staff_api, T0 + HOUR, T0 + 3 * HOUR, channels=["gpu-a"])
    assert made.status_code == 201, made.data
    assert made.data["channels"] == ["gpu-a"] and made.data["reason"] == FIRMWARE
    for api in (ana_api, staff_api):
        refused = book(api, "gpu-a", T0 + 2 * HOUR, T0 + 4 * HOUR)
        assert refused.status_code == 400
        assert (
            refused.data["message"] == f"start: channel gpu-a is closed Mon 7 Dec 09:00–11:00 UTC: {FIRMWARE}"
        )
    assert book(ana_api, "gpu-a", T0 + 3 * HOUR, T0 + 4 * HOUR).status_code == 201  # right after it
    assert book(ana_api, "gpu-b", T0 + 2 * HOUR, T0 + 3 * HOUR).status_code == 201  # another channel
    hints = ana_api.get(
        "/api/reservations/hints",
        {"channel": "gpu-a", "start": iso(T0 + HOUR), "end": iso(T0 + 2 * HOUR), "model": "qwen"},
    )
    assert any(
        w["blocking"] and "closed Mon 7 Dec 09:00–11:00 UTC" in w["message"] for w in hints.data["warnings"]
    ), hints.data


def test_a_blackout_naming_no_channel_closes_every_channel(world, frozen, ana_api, staff_api):
    assert (
        close(staff_api, T0 + HOUR, T0 + 2 * HOUR, reason="the machine room's power is off").status_code
        == 201
    )
    for channel in ("gpu-a", "gpu-b"):
        refused = book(ana_api, channel, T0 + HOUR, T0 + 2 * HOUR)
        assert refused.status_code == 400 and "the machine room's power is off" in refused.data["message"]


def test_a_blackout_over_bookings_names_them_and_saves_nothing_unless_told_to_cancel_them(
    world, frozen, ana_api, staff_api, staff, queued
):
    ana_booking = book(ana_api, "gpu-a", T0 + 2 * HOUR, T0 + 3 * HOUR).data["id"]
    refused = close(staff_api, T0 + HOUR, T0 + 4 * HOUR, channels=["gpu-a"])
    assert refused.status_code == 400
    assert refused.data["message"].startswith(
        "cancel_bookings: 1 booking(s) overlap it (ana's of gpu-a, Mon 7 Dec 10:00–11:00 UTC)"
    )
    assert not Blackout.objects.exists()
    assert Reservation.objects.get(pk=ana_booking).status == ReservationStatus.APPROVED

    made = close(staff_api, T0 + HOUR, T0 + 4 * HOUR, channels=["gpu-a"], cancel_bookings=True)
    assert made.status_code == 201 and made.data["cancelled"] == [ana_booking]
    assert Reservation.objects.get(pk=ana_booking).status == ReservationStatus.CANCELLED
    queued.run()
    told = Notification.objects.get(user__username="ana", event="cancelled")
    assert told.text == (
        f"Your reservation of gpu-a, Mon 7 Dec 10:00–11:00 UTC, was cancelled by {staff}: the channel is "
        f"closed Mon 7 Dec 09:00–12:00 UTC: {FIRMWARE}."
    )


def test_a_booking_under_way_is_ended_by_a_blackout_from_now_and_refuses_one_that_begins_later(
    world, frozen, ana_api, staff_api
):
    under_way = factories.reservation(
        owner=world_user("ana"), on=world.channel, start=T0 - HOUR, end=T0 + 2 * HOUR, target=world.preset
    )
    later = close(staff_api, T0 + HOUR, T0 + 3 * HOUR, channels=["gpu-a"], cancel_bookings=True)
    assert later.status_code == 400
    assert later.data["message"] == (
        "start: ana's of gpu-a, Mon 7 Dec 07:00–10:00 UTC is under way and runs into the blackout: end it "
        "first, or begin the blackout at Mon 7 Dec 10:00 UTC"
    )
    now = close(staff_api, T0 - HOUR, T0 + 3 * HOUR, channels=["gpu-a"], cancel_bookings=True)
    assert now.status_code == 201, now.data
    assert now.data["start"] == iso(T0)  # from now: no time that has passed is closed
    under_way.refresh_from_db()
    assert (under_way.status, under_way.end) == (ReservationStatus.ENDED, T0)


def world_user(name):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(username=name)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"reason": "   "}, "reason"),
        ({"reason": "x" * 301}, "reason"),
        ({"start": iso(T0 + 2 * HOUR), "end": iso(T0 + HOUR)}, "end"),
        ({"start": iso(T0 - 3 * HOUR), "end": iso(T0 - HOUR)}, "end"),
        ({"channels": ["no-such-channel"]}, "channels"),
        ({"start": "tomorrow"}, "start"),
    ],
)
def test_a_bad_blackout_is_a_400_naming_the_field_and_saves_nothing(world, frozen, staff_api, body, field):
    given = {"channels": ["gpu-a"], "start": iso(T0 + HOUR), "end": iso(T0 + 2 * HOUR), "reason": FIRMWARE}
    answer = staff_api.post("/api/blackouts/", {**given, **body}, format="json")
    assert answer.status_code == 400
    assert field in answer.data, answer.data
    assert not Blackout.objects.exists()


def test_members_read_blackouts_and_bulletins_but_make_or_remove_none(world, frozen, ana_api, staff_api):
    blackout = close(staff_api, T0 + HOUR, T0 + 2 * HOUR, channels=["gpu-a"]).data["id"]
    said = staff_api.post("/api/bulletins/", {"text": "New GPUs on Friday"}, format="json")
    assert said.status_code == 201, said.data
    assert [b["id"] for b in ana_api.get("/api/blackouts/").data] == [blackout]
    assert [a["text"] for a in ana_api.get("/api/bulletins/").data] == ["New GPUs on Friday"]
    assert close(ana_api, T0 + 3 * HOUR, T0 + 4 * HOUR).status_code == 403
    assert ana_api.delete(f"/api/blackouts/{blackout}/").status_code == 403
    assert ana_api.post("/api/bulletins/", {"text": "mine"}, format="json").status_code == 403
    assert ana_api.delete(f"/api/bulletins/{said.data['id']}/").status_code == 403
    assert Blackout.objects.count() == 1 and Bulletin.objects.count() == 1
    assert staff_api.delete(f"/api/blackouts/{blackout}/").status_code == 204
    assert book(ana_api, "gpu-a", T0 + HOUR, T0 + 2 * HOUR).status_code == 201  # open again


def test_a_bulletin_is_shown_on_the_overview_only_while_it_is_due(world, frozen, ana, staff_api):
    page = factories.client_for(ana)
    staff_api.post("/api/bulletins/", {"text": "Quiet hours tonight"}, format="json")
    staff_api.post(
        "/api/bulletins/",
        {"text": "Next week's news", "shown_from": iso(T0 + 24 * HOUR)},
        format="json",
    )
    over = staff_api.post("/api/bulletins/", {"text": "old", "shown_until": iso(T0 - HOUR)}, format="json")
    assert over.status_code == 400 and "shown_until" in over.data
    close(staff_api, T0 + 2 * HOUR, T0 + 4 * HOUR, channels=["gpu-b"], reason="driver upgrade")
    shown = page.get("/").content.decode()
    assert "Quiet hours tonight" in shown and "Next week's news" not in shown
    assert "Closed Mon 7 Dec 10:00 – Mon 7 Dec 12:00 UTC:</strong> gpu-b — driver upgrade" in shown
    assert [a["text"] for a in factories.client_for(ana).get("/api/bulletins/").json()] == [
        "Quiet hours tonight"
    ]


def test_the_calendar_and_its_agenda_show_a_blackout_with_its_reason(world, frozen, ana, staff_api):
    close(staff_api, T0 + HOUR, T0 + 3 * HOUR, channels=["gpu-a"])
    page = factories.client_for(ana)
    day = page.get("/calendar/", {"day": "2026-12-07"}).content.decode()
    assert f'title="closed Mon 7 Dec 09:00–11:00 UTC: {FIRMWARE}">closed: {FIRMWARE}</div>' in day
    assert day.count('class="closed"') == 1  # gpu-a's lane only
    agenda = page.get("/calendar/", {"day": "2026-12-07", "view": "agenda"}).content.decode()
    assert f"<strong>gpu-a</strong> is closed Mon 7 Dec 09:00–11:00 UTC: {FIRMWARE}" in agenda


def test_a_booking_on_any_channel_that_fits_skips_a_closed_one(world, frozen, ana_api, staff_api):
    close(staff_api, T0 + HOUR, T0 + 2 * HOUR, channels=["gpu-a"])
    placed = book(ana_api, "auto", T0 + HOUR, T0 + 2 * HOUR)
    assert placed.status_code == 201, placed.data
    assert placed.data["channel"] == world.other.pk
    close(staff_api, T0 + HOUR, T0 + 2 * HOUR, channels=["gpu-b"], cancel_bookings=True)
    refused = book(ana_api, "auto", T0 + HOUR, T0 + 2 * HOUR)
    assert refused.status_code == 409
    said = refused.data["message"]
    assert said.startswith("no channel can take this booking: every channel that fits is out of reach: ")
    assert said.endswith(" closed then (the calendar says why)") and {"gpu-a", "gpu-b"} <= set(
        said.replace(",", " ").split()
    ), said


def test_staff_close_channels_on_the_portal_page_and_members_are_told_it_is_for_staff(
    world, frozen, ana, staff
):
    refused = factories.client_for(ana).get("/closures/")
    assert refused.status_code == 403 and "is for staff" in refused.content.decode()
    page = factories.client_for(staff)
    made = page.post(
        "/closures/",
        {
            "blackout": "1",
            "b-channels": [world.channel.pk],
            "b-start": "2026-12-07T09:00",
            "b-end": "2026-12-07T11:00",
            "b-reason": FIRMWARE,
        },
    )
    assert made.status_code == 302
    listed = page.get("/closures/").content.decode()
    assert "gpu-a closed Mon 7 Dec 09:00–11:00 UTC." in listed and FIRMWARE in listed
    empty = page.post("/closures/", {"bulletin": "1", "a-text": "   "})
    assert empty.status_code == 400 and not Bulletin.objects.exists()


def test_the_audit_trail_keeps_who_closed_which_channels(world, frozen, staff_api, staff):
    close(staff_api, T0 + HOUR, T0 + 2 * HOUR, channels=["gpu-a"])
    rows = staff_api.get("/api/audit/", {"what": "blackout"}).data["results"]
    assert {row["who"] for row in rows} == {staff.username}
    assert any("gpu-a" in str(row["changes"]) for row in rows), rows
