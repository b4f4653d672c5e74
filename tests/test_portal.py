"""The booking portal's pages: real data rendered, forms, permissions, CSRF and time zones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.test import Client

from channels_app.models import ChannelRuntime, ChannelTarget
from reservations.models import Profile, Reservation
from reservations.profiles import profile_for
from slotserve_base.vocabulary import Phase
from tests import clock, factories
from tests.factories import client_for
from tests.world import World

T0 = clock.T0 - timedelta(hours=3)  # 13:00 in Shanghai
HOUR = timedelta(hours=1)
GiB = 2**30


@pytest.fixture
def world(db, frozen, ana, bo, staff):
    qwen = factories.llm("qwen-7b", size=5 * GiB)
    chat = factories.preset(qwen, "chat", "-c 8192 --port 9 -ngl 99")
    big = factories.llm("llama-70b", size=40 * GiB)
    factories.preset(big, "long")
    channel = factories.channel("a100-0", default=chat, on=factories.node("gpu-a", memory=24 * GiB))
    booked = factories.reservation(owner=ana, on=channel, start=T0 - HOUR, end=T0 + HOUR, target=chat)
    return World(channel=channel, model=qwen, preset=chat, other_model=big, ana=ana, bo=bo, booked=booked)


def test_pages_need_login(db):
    answer = Client().get("/")
    assert answer.status_code == 302
    assert answer["Location"].startswith("/accounts/login/")
    assert Client().get("/accounts/login/").status_code == 200


def test_overview_says_what_runs_and_why(world, ana):
    ChannelTarget.objects.create(
        channel=world.channel,
        model=world.model,
        preset=world.preset,
        reason="active_reservation",
        valid_until=T0 + HOUR,
        reservation=world.booked,
    )
    ChannelRuntime.objects.create(
        channel=world.channel, phase=Phase.READY, model=world.model, preset=world.preset
    )
    profile = profile_for(ana)
    profile.time_zone = "Asia/Shanghai"
    profile.save()
    page = client_for(ana).get("/").content.decode()
    assert "a100-0" in page
    assert "gpu-a" in page
    assert "ready" in page
    assert "qwen-7b / chat" in page
    assert "booked by ana until 14:00" in page  # 06:00 UTC in Shanghai
    assert "Channel controls" not in page  # staff only
    partial = client_for(ana).get("/?partial=1").content.decode()
    assert "booked by ana until 14:00" in partial and "<nav>" not in partial


def test_overview_shows_failure_and_fallback(world, staff):
    ChannelRuntime.objects.create(
        channel=world.channel,
        phase=Phase.READY,
        model=world.model,
        preset=world.preset,
        fallback=True,
        error="CUDA out of memory: lower -ngl or -c",
        retry_at=T0 + timedelta(minutes=2),
    )
    page = client_for(staff).get("/").content.decode()
    assert "CUDA out of memory: lower -ngl or -c" in page
    assert "the default model serves this booking until the retry at 05:02" in page
    assert "Channel controls" in page


def test_calendar_shows_reservations_pending_and_preloads(world, ana, bo):
    world.channel.approval_policy = "all"
    world.channel.save()
    factories.reservation(
        owner=bo,
        on=world.channel,
        start=T0 + 3 * HOUR,
        end=T0 + 4 * HOUR,
        target=world.preset,
        status="pending",
    )
    other = factories.preset(world.other_model, "b2")
    factories.reservation(owner=bo, on=world.channel, start=T0 + HOUR, end=T0 + 2 * HOUR, target=other)
    page = client_for(ana).get("/calendar/", {"day": "2026-12-07"}).content.decode()
    assert '<span class="who">yours</span><span class="what">qwen-7b</span>' in page
    assert 'title="ana, Mon 7 Dec' in page and 'qwen-7b / chat"' in page
    assert "res approved mine" in page
    assert "res pending" in page and "(pending approval)" in page
    # bo's 70B model follows ana's booking directly: its loading eats into bo's slot.
    assert 'class="lost"' in page and "min lost to loading" in page
    assert 'class="now"' in page
    week = client_for(ana).get("/calendar/", {"day": "2026-12-09", "view": "week"})
    text = week.content.decode()
    assert week.status_code == 200 and "week of Mon 7 Dec 2026" in text
    # A lane a day, each 24 hours wide: Monday's bookings sit in Monday's lane, readable.
    labels = [part.split("</div>")[0] for part in text.split('<div class="lane-label">')[1:]]
    assert labels == ["Mon 07", "Tue 08", "Wed 09", "Thu 10", "Fri 11", "Sat 12", "Sun 13"]
    monday = text.split('<div class="lane-label">Mon 07</div>')[1].split(
        '<div class="lane-label">Tue 08</div>'
    )[0]
    assert '<span class="who">yours</span><span class="what">qwen-7b</span>' in monday
    assert '<span class="who">pending: bo</span><span class="what">qwen-7b</span>' in monday
    assert 'data-origin="2026-12-07T00:00:00+' in monday or 'data-origin="2026-12-07T00:00:00-' in monday


def test_models_page_lists_presets_and_vram(world, ana):
    page = client_for(ana).get("/models/").content.decode()
    assert "llama-70b" in page
    assert "-c 8192 -ngl 99" in page  # --port 9 removed
    row = page[page.index('data-model="llama-70b"') :]
    assert "a100-0" in row[: row.index("</tr>")]


def test_booking_form_in_shanghai_time_stores_utc(world, bo):
    profile = profile_for(bo)
    profile.time_zone = "Asia/Shanghai"
    profile.save()
    answer = client_for(bo).post(
        "/book/",
        {
            "channel": world.channel.pk,
            "start": "2026-12-08T14:00",
            "end": "2026-12-08T16:00",
            "model": world.model.pk,
            "preset": world.preset.pk,
        },
    )
    assert answer.status_code == 302, answer.content.decode()[:2000]
    made = Reservation.objects.get(user=bo)
    assert made.start == datetime(2026, 12, 8, 6, 0, tzinfo=UTC)
    assert made.end == datetime(2026, 12, 8, 8, 0, tzinfo=UTC)
    page = client_for(bo).get("/reservations/").content.decode()
    assert "Tue 8 Dec 2026 14:00 – 16:00" in page


def test_daylight_saving_change_inside_a_reservation(world, bo):
    """25 October 2026, Berlin: clocks go back at 03:00, so 01:00–05:00 lasts five hours."""
    profile = profile_for(bo)
    profile.time_zone = "Europe/Berlin"
    profile.save()
    world.channel.max_booking_minutes = 270
    world.channel.save()
    form = {
        "channel": world.channel.pk,
        "start": "2026-10-25T01:00",
        "end": "2026-10-25T05:00",
        "model": world.model.pk,
        "preset": world.preset.pk,
        "note": "night run",
    }
    with time_machine.travel(datetime(2026, 10, 20, tzinfo=UTC), tick=False):
        refused = client_for(bo).post("/book/", form)
        assert refused.status_code == 200
        assert "a booking on this channel lasts at most 270 minutes" in refused.content.decode()
        world.channel.max_booking_minutes = 300
        world.channel.save()
        assert client_for(bo).post("/book/", form).status_code == 302
    made = Reservation.objects.get(user=bo)
    assert made.end - made.start == timedelta(hours=5)
    assert made.start == datetime(2026, 10, 24, 23, 0, tzinfo=UTC)
    with time_machine.travel(datetime(2026, 10, 20, tzinfo=UTC), tick=False):
        page = client_for(bo).get("/reservations/").content.decode()
    assert "Sun 25 Oct 2026 01:00 – 05:00" in page


def test_a_time_that_does_not_exist_is_named(world, bo):
    profile = profile_for(bo)
    profile.time_zone = "Europe/Berlin"
    profile.save()
    with time_machine.travel(datetime(2027, 3, 20, tzinfo=UTC), tick=False):
        answer = client_for(bo).post(
            "/book/",
            {
                "channel": world.channel.pk,
                "start": "2027-03-28T02:30",
                "end": "2027-03-28T04:00",
                "model": world.model.pk,
            },
        )
    assert answer.status_code == 200
    assert "interpreted in time zone Europe/Berlin; it may be ambiguous or it may not exist" in (
        answer.content.decode()
    )
    assert not Reservation.objects.filter(user=bo).exists()


def test_refused_booking_keeps_what_was_typed(world, bo):
    answer = client_for(bo).post(
        "/book/",
        {
            "channel": world.channel.pk,
            "start": "2026-12-07T05:30",
            "end": "2026-12-07T07:00",
            "model": world.model.pk,
            "note": "my careful note",
        },
    )
    page = answer.content.decode()
    assert answer.status_code == 200
    assert f"overlaps reservation {world.booked.pk}" in page
    assert "my careful note" in page
    assert 'value="2026-12-07T05:30"' in page


def test_csrf_is_enforced(world, ana):
    answer = client_for(ana, csrf=True).post(f"/reservations/{world.booked.pk}/end")
    assert answer.status_code == 403
    assert Reservation.objects.get(pk=world.booked.pk).status == "approved"


def test_other_users_reservations_answer_404(world, bo):
    for action in ("end", "cancel", "extend"):
        assert client_for(bo).post(f"/reservations/{world.booked.pk}/{action}").status_code == 404
    assert Reservation.objects.get(pk=world.booked.pk).status == "approved"


def test_end_and_extend_from_the_portal(world, ana, bo):
    extended = client_for(ana).post(f"/reservations/{world.booked.pk}/extend", {"end": "2026-12-07T07:00"})
    assert extended.status_code == 302
    assert Reservation.objects.get(pk=world.booked.pk).end == T0 + 2 * HOUR
    factories.reservation(
        owner=bo, on=world.channel, start=T0 + 2 * HOUR, end=T0 + 3 * HOUR, target=world.preset
    )
    blocked = client_for(ana).post(
        f"/reservations/{world.booked.pk}/extend", {"end": "2026-12-07T09:00"}, follow=True
    )
    assert "overlaps reservation" in blocked.content.decode()
    assert Reservation.objects.get(pk=world.booked.pk).end == T0 + 2 * HOUR
    ended = client_for(ana).post(f"/reservations/{world.booked.pk}/end", follow=True)
    assert "Reservation ended" in ended.content.decode()
    assert Reservation.objects.get(pk=world.booked.pk).status == "ended"


def test_approvals_page_is_for_staff(world, ana, bo, staff):
    world.channel.approval_policy = "all"
    world.channel.save()
    pending = factories.reservation(
        owner=bo,
        on=world.channel,
        start=T0 + 2 * HOUR,
        end=T0 + 3 * HOUR,
        target=world.preset,
        status="pending",
    )
    assert client_for(ana).get("/approvals/").status_code == 403  # staff and group approvers only
    page = client_for(staff).get("/approvals/").content.decode()
    assert f'data-reservation="{pending.pk}"' in page
    assert 'id="approvals-count">1<' in page
    client_for(staff).post(f"/approvals/{pending.pk}/reject", {"reason": "GPU maintenance"})
    pending.refresh_from_db()
    assert (pending.status, pending.reject_reason) == ("rejected", "GPU maintenance")


def test_a_large_labs_overview_leaves_each_cards_controls_to_be_fetched(world, staff, ana, monkeypatch):
    from channels_app.models import Channel
    from portal import views

    monkeypatch.setattr(views, "CONTROLS_INLINE", 0)  # the world's one channel is past it
    page = client_for(staff).get("/").content.decode()
    channel = Channel.objects.order_by("pk").first()
    assert channel is not None
    assert f'data-controls="/channel/{channel.pk}/controls"' in page
    assert "Set override" not in page and "<select" not in page
    controls = client_for(staff).get(f"/channel/{channel.pk}/controls")
    assert controls.status_code == 200 and "Set override" in controls.content.decode()
    assert f'name="ch{channel.pk}-until"' in controls.content.decode()
    assert client_for(ana).get(f"/channel/{channel.pk}/controls").status_code == 302  # staff only
    assert client_for(staff).get("/channel/99999/controls").status_code == 404


def test_staff_sets_an_override_from_the_overview(world, staff, django_capture_on_commit_callbacks):
    world.booked.delete()
    with django_capture_on_commit_callbacks(execute=True):
        answer = client_for(staff).post(
            f"/channel/{world.channel.pk}/override",
            {f"ch{world.channel.pk}-unload": "on", f"ch{world.channel.pk}-until": "2026-12-07T07:00"},
        )
    assert answer.status_code == 302
    assert ChannelTarget.objects.get(channel=world.channel).reason == "manual_unload"


def test_preferences_and_keys_pages(world, ana):
    client = client_for(ana)
    saved = client.post("/settings/", {"time_zone": "Asia/Shanghai", "email_approved": "on"})
    assert saved.status_code == 302
    profile = Profile.objects.get(user=ana)
    assert profile.time_zone == "Asia/Shanghai"
    assert profile.wants_email("approved") and not profile.wants_email("rejected")
    assert profile.calendar_token in client.get("/settings/").content.decode()
    made = client.post("/keys/", {"name": "notebook"}).content.decode()
    assert 'id="new-key">ss-' in made
    assert 'id="new-key"' not in client.get("/keys/").content.decode()


def test_calendar_feed(world, ana, bo):
    token = profile_for(ana).calendar_token
    answer = Client().get(f"/calendar/{token}.ics")
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/calendar")
    body = answer.content.decode()
    assert "BEGIN:VEVENT" in body and "a100-0: qwen-7b" in body
    assert "DTSTART:20261207T040000Z" in body
    assert Client().get("/calendar/not-a-token.ics").status_code == 404
    assert (
        "BEGIN:VEVENT" not in Client().get(f"/calendar/{profile_for(bo).calendar_token}.ics").content.decode()
    )


def test_a_calendar_program_that_fetches_again_gets_304_until_a_booking_changes(world, ana):
    from reservations.models import Reservation

    token = profile_for(ana).calendar_token
    first = Client().get(f"/calendar/{token}.ics")
    assert first.status_code == 200 and first["ETag"]
    again = Client().get(f"/calendar/{token}.ics", HTTP_IF_NONE_MATCH=first["ETag"])
    assert again.status_code == 304 and again.content == b""
    booking = Reservation.objects.filter(user=ana).first()
    assert booking is not None
    Reservation.objects.filter(pk=booking.pk).update(note="bring the eval set")
    changed = Client().get(f"/calendar/{token}.ics", HTTP_IF_NONE_MATCH=first["ETag"])
    assert changed.status_code == 200 and changed["ETag"] != first["ETag"]
    assert "bring the eval set" in changed.content.decode()


def test_openapi_schema_and_docs(db, ana):
    schema = client_for(ana).get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/reservations/{id}/extend" in schema.content
    docs = client_for(ana).get("/api/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()


def test_me_endpoint(db, ana_api):
    me = ana_api.get("/api/me/").data
    assert me["username"] == "ana" and me["time_zone"] == "UTC" and me["calendar_url"].endswith(".ics")
    changed = ana_api.patch(
        "/api/me/", {"time_zone": "Asia/Shanghai", "email_events": {"approved": False}}, format="json"
    )
    assert changed.status_code == 200 and changed.data["time_zone"] == "Asia/Shanghai"
    bad = ana_api.patch("/api/me/", {"time_zone": "Mars/Olympus"}, format="json")
    assert bad.status_code == 400 and bad.data["message"].startswith("time_zone: 'Mars/Olympus' is not")
    bad_events = ana_api.patch("/api/me/", {"email_events": {"spam": True}}, format="json")
    assert bad_events.status_code == 400 and "email_events" in bad_events.data
    assert Profile.objects.get(user__username="ana").time_zone == "Asia/Shanghai"
