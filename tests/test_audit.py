"""The audit trail (docs/architecture.md, "The audit trail"): every change a person or a key
makes, recorded once whichever path made it, with who, when, through what, and before -> after;
shown to staff, in the REST API and as CSV."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from gateway.api_keys import api_key_create
from reservations.models import ReservationStatus
from slotserve_base.audit_trail import row_of
from tests import factories
from tests.test_browser import browser  # noqa: F401  (a fixture)

pytestmark = pytest.mark.django_db


def entries(model: str) -> list[Any]:
    from auditlog.models import LogEntry

    return list(LogEntry.objects.filter(content_type__model=model).order_by("timestamp", "pk"))


def test_an_override_made_through_the_portal_the_api_and_the_admin_is_recorded_once_each():
    boss = factories.user("boss", staff=True)
    boss.is_superuser = True
    boss.save()
    qwen, llama = factories.llm("qwen"), factories.llm("llama")
    channel = factories.channel("a100-0")
    until = timezone.localtime() + timedelta(hours=2)
    portal = Client()
    portal.force_login(boss)
    sent = portal.post(
        f"/channel/{channel.pk}/override",
        {f"ch{channel.pk}-model": qwen.pk, f"ch{channel.pk}-until": f"{until:%Y-%m-%dT%H:%M}"},
    )
    assert sent.status_code == 302
    _, key = api_key_create(user=boss, name="ops")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert api.post(
        f"/api/channels/{channel.pk}/override", {"model": "llama", "until": until.isoformat()}, format="json"
    ).status_code in (200, 201)
    from channels_app.models import Override

    override = Override.objects.get(channel=channel)
    admin_sent = portal.post(
        f"/admin/channels_app/override/{override.pk}/change/",
        {
            "model": qwen.pk,
            "preset": "",
            "until_0": f"{until:%Y-%m-%d}",
            "until_1": f"{until:%H:%M:%S}",
        },
    )
    assert admin_sent.status_code == 302, admin_sent.content.decode()[:2000]
    made = entries("override")
    assert [e.additional_data["via"] for e in made] == ["portal", "api", "admin"], [e.changes for e in made]
    assert all(e.actor == boss for e in made)
    assert made[1].additional_data["key"] == "ops"
    assert made[1].changes_display_dict["model"] == [str(qwen), str(llama)]  # before -> after
    assert made[2].changes_display_dict["model"] == [str(llama), str(qwen)]


def test_an_approval_a_revoked_key_and_a_paused_webhook_are_recorded_with_before_and_after():
    from reservations.services import reservation_approve

    boss, ana = factories.user("boss", staff=True), factories.user("ana")
    channel = factories.channel("a100-0", policy="all")
    start = timezone.now() + timedelta(days=1)
    booking = factories.reservation(
        owner=ana, on=channel, start=start, end=start + timedelta(hours=1), status=ReservationStatus.PENDING
    )
    reservation_approve(reservation=booking, by=boss, now=timezone.now())
    (approved,) = [e for e in entries("reservation") if e.action == e.Action.UPDATE]
    assert approved.changes_dict["status"] == ["pending", "approved"]
    assert row_of(approved)["via"] == "system"  # no request: a task or a command
    api_key, _ = api_key_create(user=ana, name="notebook")
    client = APIClient()
    client.force_authenticate(ana)
    assert client.delete(f"/api/keys/{api_key.pk}/").status_code == 204
    revoked = entries("apikey")[-1]
    assert "revoked_at" in revoked.changes_dict and revoked.actor == ana


def test_staff_read_the_trail_filtered_in_the_portal_the_api_and_as_csv_and_nobody_else_does():
    boss, ana = factories.user("boss", staff=True), factories.user("ana")
    channel = factories.channel("a100-0")
    api = APIClient()
    api.force_authenticate(boss)
    assert (
        api.patch(f"/api/channels/{channel.pk}/", {"approval_policy": "all"}, format="json").status_code
        == 200
    )
    factories.channel("a100-1")  # made by nobody in particular
    found = api.get("/api/audit/", {"who": "boss"}).data
    assert found["count"] == 1, found
    (row,) = found["results"]
    assert (row["who"], row["what"], row["object"], row["via"]) == ("boss", "channel", "a100-0", "api")
    assert row["changes"]["approval_policy"] == ["none", "all"]
    assert api.get("/api/audit/", {"what": "channel"}).data["count"] >= 2
    page = Client()
    page.force_login(boss)
    shown = page.get("/audit/", {"who": "boss"}).content.decode()
    assert "a100-0" in shown and "approval_policy" in shown
    assert "No approval → Every booking needs approval" in shown  # as people read it
    exported = page.get("/audit/csv", {"who": "boss"})
    table = list(csv.DictReader(io.StringIO(b"".join(exported.streaming_content).decode())))  # type: ignore[attr-defined]
    assert [r["object"] for r in table] == ["a100-0"]
    member = Client()
    member.force_login(ana)
    assert member.get("/audit/").status_code in (302, 403)
    outsider = APIClient()
    outsider.force_authenticate(ana)
    assert outsider.get("/api/audit/").status_code == 403
    bad = api.get("/api/audit/", {"since": "yesterday"})
    assert bad.status_code == 400 and "since" in bad.data


def test_entries_older_than_the_retention_go(settings):
    from auditlog.models import LogEntry

    from slotserve_site.tasks import forget_old

    settings.SLOTSERVE_AUDIT_DAYS = 30
    factories.channel("a100-0")
    factories.channel("a100-1")
    everything = list(LogEntry.objects.order_by("pk").values_list("pk", flat=True))
    old = everything[0]
    LogEntry.objects.filter(pk=old).update(timestamp=timezone.now() - timedelta(days=31))
    assert forget_old(timezone.now()) == 1
    assert list(LogEntry.objects.order_by("pk").values_list("pk", flat=True)) == everything[1:]


@pytest.mark.django_db(transaction=True)
def test_the_trail_reads_on_a_phone(browser, live_server):  # noqa: F811
    from pathlib import Path

    from tests.test_browser import CHROMIUM, shot, sign_in

    if not Path(CHROMIUM).exists():
        pytest.skip("needs Chromium (apt-get install chromium)")
    boss = factories.user("boss", staff=True)
    channel = factories.channel("a100-with-a-long-channel-name-0")
    api = APIClient()
    api.force_authenticate(boss)
    assert (
        api.patch(f"/api/channels/{channel.pk}/", {"approval_policy": "all"}, format="json").status_code
        == 200
    )
    page = sign_in(browser, live_server, "boss", width=390, height=844)
    page.goto(f"{live_server.url}/audit/")
    row = page.locator("#audit-table tr", has_text="Every booking needs approval")
    assert "boss" in row.inner_text() and "api" in row.inner_text()
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
    shot(page, "phone-audit")
    page.set_viewport_size({"width": 1366, "height": 768})
    shot(page, "audit")


def test_every_time_in_the_trail_is_in_the_readers_zone_or_names_its_zone():
    """A booking moved to 10:00 in Paris reads 10:00 CET on a Paris reader's page, not the UTC
    hour stored; the CSV names the zone of each time it writes."""
    from reservations.profiles import profile_for
    from reservations.services import reservation_change

    boss, ana = factories.user("boss", staff=True), factories.user("ana")
    profile = profile_for(boss)
    profile.time_zone = "Europe/Paris"
    profile.save()
    channel = factories.channel("a100-0")
    start = timezone.now().replace(microsecond=0) + timedelta(days=2)
    booking = factories.reservation(owner=ana, on=channel, start=start, end=start + timedelta(hours=2))
    moved = start.replace(hour=9, minute=0, second=0)  # 09:00 UTC: 10:00 in Paris in December
    reservation_change(
        reservation=booking, by=ana, now=timezone.now(), start=moved, end=moved + timedelta(hours=1)
    )
    page = Client()
    page.force_login(boss)
    shown = page.get("/audit/", {"what": "reservation"}).content.decode()
    assert f"{moved:%-d %b %Y} 10:00 CET" in shown, shown[shown.find("<table") :][:3000]
    assert "9 a.m." not in shown
    exported = page.get("/audit/csv", {"what": "reservation"})
    text = b"".join(exported.streaming_content).decode()  # type: ignore[attr-defined]
    assert "10:00 CET" in text


def test_a_member_who_opens_the_trail_is_told_it_is_for_staff():
    ana = factories.user("ana")
    member = Client()
    member.force_login(ana)
    answer = member.get("/audit/")
    assert answer.status_code == 403
    page = answer.content.decode()
    assert "for staff" in page and 'id="nav-zone"' in page  # a portal page, not the admin's sign-in
    assert member.get("/audit/csv").status_code == 403


def test_the_trail_names_related_objects_in_a_few_queries_however_many_entries_it_shows(
    django_assert_max_num_queries,
):
    """A page of 200 entries read each booking's person, channel and model one at a time (800
    queries at the lab's size): the names are read together, once per kind."""
    boss = factories.user("boss", staff=True)
    people = [factories.user(f"user{n}") for n in range(6)]
    channels = [factories.channel(f"a100-{n}") for n in range(6)]
    chat = factories.preset(factories.llm("qwen"), "chat")
    start = timezone.now().replace(microsecond=0) + timedelta(days=2)
    for n in range(30):
        at = start + timedelta(hours=n)
        factories.reservation(
            owner=people[n % 6], on=channels[n % 6], start=at, end=at + timedelta(hours=1), target=chat
        )
    page = Client()
    page.force_login(boss)
    page.get("/audit/")  # the session and the profile, read once
    with django_assert_max_num_queries(20):
        shown = page.get("/audit/", {"what": "reservation"}).content.decode()
    row = shown[shown.index("<code>preset</code>") :][:80]
    assert shown.count("<tr") >= 31 and "qwen/chat" in row, row  # the preset by its name
    api = APIClient()
    api.force_authenticate(boss)
    with django_assert_max_num_queries(20):
        listed = api.get("/api/audit/", {"what": "reservation"}).data["results"]
    assert len(listed) == 30 and {row["shown"]["channel"][1] for row in listed} >= {"a100-0", "a100-5"}
