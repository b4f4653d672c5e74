"""A team's day in the portal: time zones done once, honest hints, what the pages list, and the
admin's widgets (the browser flows are in ``test_browser``)."""

from __future__ import annotations

import html
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from reservations.models import Notification, Reservation
from reservations.profiles import profile_for
from tests import factories
from tests.clock import T0

HOUR = timedelta(hours=1)


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def in_zone(user, zone: str) -> None:
    profile = profile_for(user)
    profile.time_zone, profile.time_zone_chosen = zone, True
    profile.save()


def hints(client: Client, channel, start: str, end: str, **extra) -> Any:
    answer = client.get(
        "/api/reservations/hints", {"channel": channel.pk, "start": start, "end": end, **extra}
    )
    assert answer.status_code == 200, answer.content
    return answer.json()["warnings"]


# --- Time zones ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_browsers_zone_is_taken_at_first_and_never_over_a_choice(ana):
    client = client_for(ana)
    assert profile_for(ana).time_zone_chosen is False
    taken = client.post("/settings/time-zone", {"time_zone": "Europe/Berlin", "detected": "1"})
    assert taken.json() == {"time_zone": "Europe/Berlin", "changed": True}
    again = client.post("/settings/time-zone", {"time_zone": "Asia/Tokyo", "detected": "1"})
    assert again.json() == {"time_zone": "Europe/Berlin", "changed": False}, "detection never overrides"
    chosen = client.post("/settings/time-zone", {"time_zone": "Asia/Tokyo"})  # the offer, accepted
    assert chosen.json() == {"time_zone": "Asia/Tokyo", "changed": True}
    bad = client.post("/settings/time-zone", {"time_zone": "Mars/Olympus"})
    assert bad.status_code == 400 and bad.json()["field"] == "time_zone"
    assert "'Mars/Olympus' is not a time zone" in bad.json()["message"]
    assert profile_for(ana).time_zone == "Asia/Tokyo"
    page = client.get("/").content.decode()
    assert 'id="nav-zone">Asia/Tokyo<' in page


@pytest.mark.django_db
def test_hints_read_local_times_in_the_profiles_zone_as_the_submit_does(frozen, ana, bo):
    """One path from typed time to UTC: ``11:00`` typed by a Berlin user is 10:00 UTC both for the
    hints and for the booking."""
    in_zone(ana, "Europe/Berlin")
    chat = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0")
    factories.reservation(
        owner=bo, on=channel, start=T0 + 2 * HOUR, end=T0 + 3 * HOUR, target=chat
    )  # 11–12 CET
    client = client_for(ana)
    conflict = [
        w for w in hints(client, channel, "2026-12-07T11:00", "2026-12-07T12:00") if w["code"] == "conflict"
    ]
    assert (
        conflict
        and conflict[0]["message"] == "the slot overlaps bo's booking, Mon 7 Dec 11:00–12:00 CET (approved)"
    )
    assert not [
        w for w in hints(client, channel, "2026-12-07T12:00", "2026-12-07T13:00") if w["code"] == "conflict"
    ]
    booked = client.post(
        "/book/",
        {
            "channel": channel.pk,
            "start": "2026-12-07T12:00",
            "end": "2026-12-07T13:00",
            "model": chat.model_id,
            "preset": chat.pk,
        },
    )
    assert booked.status_code == 302
    assert Reservation.objects.get(user=ana).start == T0 + 3 * HOUR  # 12:00 CET = 11:00 UTC


@pytest.mark.django_db
def test_notifications_and_errors_speak_in_the_readers_zone(frozen, ana, staff):
    from reservations import services

    in_zone(ana, "Europe/Berlin")
    in_zone(staff, "Asia/Shanghai")
    chat = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0", policy="all")
    asked = services.reservation_create(
        user=ana,
        channel=channel,
        start=T0 + 24 * HOUR,
        end=T0 + 26 * HOUR,
        now=T0,
        model=chat.model,
        preset=chat,
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


# --- Honest hints -------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("start", "end", "limits", "field", "words"),
    [
        ("2026-12-07T07:00", "2026-12-07T08:30", {}, "start", "start is in the past"),
        (
            "2026-12-07T12:00",
            "2026-12-07T12:20",
            {"min_booking_minutes": 30},
            "end",
            "lasts at least 30 minutes",
        ),
        (
            "2026-12-07T12:00",
            "2026-12-07T18:00",
            {"max_booking_minutes": 240},
            "end",
            "lasts at most 4 hours",
        ),
        ("2026-12-30T12:00", "2026-12-30T13:00", {"max_days_ahead": 14}, "start", "at most 14 days ahead"),
        (
            "2026-12-07T12:00",
            "2026-12-07T16:00",
            {"weekly_quota_hours": Decimal(3)},
            "end",
            "over your weekly quota",
        ),
    ],
)
def test_every_rule_the_submit_enforces_is_a_blocking_hint_beside_its_field(
    frozen, ana, start, end, limits, field, words
):
    chat = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0")
    for name, value in limits.items():
        setattr(channel, name, value)
    channel.save()
    client = client_for(ana)
    found = [
        w
        for w in hints(client, channel, start, end, model=chat.model_id, preset=chat.pk)
        if w["code"] == "rule"
    ]
    assert [(w["field"], w["blocking"]) for w in found] == [(field, True)], found
    assert words in found[0]["message"]
    # ... and the submit refuses it with the same words.
    refused = client.post(
        "/book/",
        {"channel": channel.pk, "start": start, "end": end, "model": chat.model_id, "preset": chat.pk},
    )
    assert refused.status_code == 200 and words in refused.content.decode()
    assert not Reservation.objects.exists()


@pytest.mark.django_db
def test_a_whole_card_where_the_channel_allows_none_is_a_blocking_hint(frozen, ana):
    channel = factories.channel("a100-0")
    channel.allow_whole_card = False
    channel.save()
    found = hints(client_for(ana), channel, "2026-12-07T12:00", "2026-12-07T13:00", exclusive="true")
    rule = [w for w in found if w["code"] == "rule"]
    assert (
        rule
        and rule[0]["field"] == "exclusive"
        and "does not allow whole-card bookings" in rule[0]["message"]
    )


@pytest.mark.django_db
def test_a_bookable_slot_has_no_blocking_hint(frozen, ana):
    chat = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0")
    found = hints(client_for(ana), channel, "2026-12-07T12:00", "2026-12-07T13:00", model=chat.model_id)
    assert not [w for w in found if w.get("blocking")], found


# --- What the pages list ------------------------------------------------------------------------


@pytest.mark.django_db
def test_my_reservations_keeps_cancelled_bookings_apart_and_says_how_past_ones_ended(frozen, ana):
    chat = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0")
    done = factories.reservation(owner=ana, on=channel, start=T0 - 3 * HOUR, end=T0 - 2 * HOUR, target=chat)
    dropped = factories.reservation(
        owner=ana, on=channel, start=T0 + 5 * HOUR, end=T0 + 6 * HOUR, target=chat, status="cancelled"
    )
    waiting = factories.reservation(
        owner=ana, on=channel, start=T0 - HOUR / 2, end=T0 + HOUR, target=chat, status="pending"
    )
    page = client_for(ana).get("/reservations/").content.decode()
    upcoming, rest = page.split("<h2>Cancelled or rejected</h2>")
    withdrawn, past = rest.split("<h2>Past</h2>")
    assert f'data-reservation="{waiting.pk}"' in upcoming, "a started pending booking still waits"
    assert f'data-reservation="{dropped.pk}"' in withdrawn and f'data-reservation="{dropped.pk}"' not in past
    row = past.split(f'data-reservation="{done.pk}"')[1].split("</tr>")[0]
    assert 'data-label="Status">completed' in row
    assert 'data-confirm="Cancel your booking of a100-0' in upcoming


@pytest.mark.django_db
def test_the_password_reset_flow_is_linked_and_each_step_renders(db):
    client = Client()
    assert 'href="/accounts/password_reset/"' in client.get("/accounts/login/").content.decode()
    form = client.get("/accounts/password_reset/")
    assert form.status_code == 200 and "Send the link" in form.content.decode()
    sent = client.post("/accounts/password_reset/", {"email": "nobody@example.org"})
    assert sent.status_code == 302
    assert "Check your email" in client.get(sent["Location"]).content.decode()
    stale = client.get("/accounts/reset/MQ/set-password/")
    assert "used already or is too old" in stale.content.decode()


# --- The admin's widgets ------------------------------------------------------------------------


@pytest.mark.django_db
def test_gpu_indexes_and_labels_are_plain_fields_in_the_admin(db):
    from django.contrib.auth import get_user_model

    from channels_app.models import Channel

    boss = get_user_model().objects.create_superuser("boss", "boss@example.org", "pw")
    node = factories.node("n1", gpus=2)
    client = client_for(boss)
    page = client.get("/admin/channels_app/channel/add/").content.decode()
    assert 'name="gpu_indexes"' in page and 'type="text"' in page
    base = {
        "name": "a100-0",
        "node": node.pk,
        "approval_policy": "none",
        "min_booking_minutes": 0,
        "allow_whole_card": "on",
    }
    bad = client.post("/admin/channels_app/channel/add/", {**base, "gpu_indexes": "0, x", "labels": ""})
    assert "&#x27;x&#x27; is not a GPU index" in bad.content.decode()
    worse = client.post(
        "/admin/channels_app/channel/add/", {**base, "gpu_indexes": "0", "labels": "gpu a100"}
    )
    assert "line 1: write key=value" in worse.content.decode()
    made = client.post(
        "/admin/channels_app/channel/add/",
        {**base, "gpu_indexes": "0, 1", "labels": "gpu=a100\nzone = lab-1"},
    )
    assert made.status_code == 302, made.content.decode()[:2000]
    channel = Channel.objects.get(name="a100-0")
    assert channel.gpu_indexes == [0, 1] and channel.labels == {"gpu": "a100", "zone": "lab-1"}
    shown = client.get(f"/admin/channels_app/channel/{channel.pk}/change/").content.decode()
    assert 'value="0, 1"' in shown and "gpu=a100\nzone=lab-1" in shown


@pytest.mark.django_db
def test_the_calendar_feed_speaks_in_the_users_zone(frozen, ana):
    in_zone(ana, "Europe/Berlin")
    chat = factories.preset(factories.llm("qwen"), "chat")
    factories.reservation(
        owner=ana, on=factories.channel("a100-0"), start=T0 + HOUR, end=T0 + 2 * HOUR, target=chat
    )
    body = Client().get(f"/calendar/{profile_for(ana).calendar_token}.ics").content.decode()
    assert "DTSTART;TZID=Europe/Berlin:20261207T100000" in body
    assert "BEGIN:VTIMEZONE" in body and "TZID:Europe/Berlin" in body
    assert "X-WR-TIMEZONE:Europe/Berlin" in body


@pytest.mark.django_db
def test_a_large_labs_calendar_shows_its_channels_a_page_at_a_time(ana):
    """Two hundred channels for a week is a page of a megabyte: the calendar shows 50 channels
    a page, in name order, and its links keep the page, the view and the filters."""
    import re

    from portal.calendar import CALENDAR_CHANNELS

    node = factories.node("big", gpus=60)
    for n in range(60):
        factories.channel(f"ch{n:02d}", on=node, gpu_indexes=[n])
    page = Client()
    page.force_login(ana)
    first = page.get("/calendar/", {"view": "week"}).content.decode()
    shown = re.findall(r'<div class="row" data-channel="([^"]+)"', first)
    assert shown == [f"ch{n:02d}" for n in range(CALENDAR_CHANNELS)] and CALENDAR_CHANNELS == 50
    later = re.search(r'href="\?([^"]*page=2[^"]*)"', first)
    assert later is not None and "view=week" in later.group(1)
    second = page.get("/calendar/?" + later.group(1).replace("&amp;", "&")).content.decode()
    assert re.findall(r'<div class="row" data-channel="([^"]+)"', second) == [
        f"ch{n:02d}" for n in range(50, 60)
    ]
    # Moving a week on keeps the page of channels.
    assert re.search(r'href="\?day=[^"]*view=week[^"]*page=2', second)
    # A filter narrows the channels first: one node's few channels fit one page.
    small = factories.node("small")
    factories.channel("only", on=small)
    filtered = page.get("/calendar/", {"view": "week", "node": small.pk}).content.decode()
    assert re.findall(r'<div class="row" data-channel="([^"]+)"', filtered) == ["only"]
    assert "page=2" not in filtered
