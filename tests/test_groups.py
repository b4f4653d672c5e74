"""Groups: channels limited to groups, a group's weekly quota across its members (also under
concurrency), and a group's approvers."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from reservations.models import GroupPolicy, Notification, Reservation
from tests import factories
from tests.factories import iso
from tests.test_concurrency import _race

HOUR = timedelta(hours=1)


def api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def body(channel, chat, start, hours=1):
    return {
        "channel": channel.pk,
        "start": iso(start),
        "end": iso(start + hours * HOUR),
        "model": chat.model_id,
        "preset": chat.pk,
    }


@pytest.fixture
def lab(db):
    chat = factories.preset(factories.llm("qwen"), "chat")
    vision = Group.objects.create(name="vision-lab")
    nlp = Group.objects.create(name="nlp-lab")
    ana, bo, carl = factories.user("ana"), factories.user("bo"), factories.user("carl")
    ana.groups.add(vision)
    bo.groups.add(vision)
    carl.groups.add(nlp)
    # Tomorrow at 10:00: the day's bookings three hours on stay on that day whenever the tests run.
    start = (timezone.now() + timedelta(days=1)).replace(hour=10, minute=0, second=0, microsecond=0)
    return {"chat": chat, "vision": vision, "nlp": nlp, "ana": ana, "bo": bo, "carl": carl, "start": start}


def test_a_channel_limited_to_groups_refuses_outsiders_and_says_why(lab, staff):
    channel = factories.channel("vision-0")
    channel.allowed_groups.add(lab["vision"])
    refused = api(lab["carl"]).post(
        "/api/reservations/", body(channel, lab["chat"], lab["start"]), format="json"
    )
    assert refused.status_code == 400
    assert (
        refused.data["message"]
        == "channel: channel vision-0 is for the groups vision-lab; you are in none of them"
    )
    assert (
        api(lab["ana"])
        .post("/api/reservations/", body(channel, lab["chat"], lab["start"]), format="json")
        .status_code
        == 201
    )
    later = lab["start"] + 3 * HOUR
    assert (
        api(staff).post("/api/reservations/", body(channel, lab["chat"], later), format="json").status_code
        == 201
    )
    hints = (
        api(lab["carl"])
        .get(
            "/api/reservations/hints",
            {
                "channel": channel.pk,
                "start": iso(later + 3 * HOUR),
                "end": iso(later + 4 * HOUR),
                "model": "qwen",
            },
        )
        .data["warnings"]
    )
    assert any(w["code"] == "rule" and w["field"] == "channel" for w in hints)


def test_any_channel_skips_channels_of_other_groups(lab):
    closed = factories.channel("vision-0", on=factories.node("n1", backends=["llama.cpp"]))
    closed.allowed_groups.add(lab["vision"])
    auto = {**body(closed, lab["chat"], lab["start"]), "channel": "auto"}
    refused = api(lab["carl"]).post("/api/reservations/", auto, format="json")
    assert refused.status_code == 409 and "are for groups you are not in" in refused.data["message"]
    factories.channel("open-0", on=factories.node("n2", backends=["llama.cpp"]))
    placed = api(lab["carl"]).post("/api/reservations/", auto, format="json")
    assert placed.status_code == 201 and placed.data["channel_name"] == "open-0"


def test_a_groups_weekly_quota_counts_all_its_members(lab):
    channel = factories.channel("shared-0")
    channel.group_weekly_quota_hours = Decimal(3)
    channel.save()
    start = lab["start"]
    assert (
        api(lab["ana"])
        .post("/api/reservations/", body(channel, lab["chat"], start, 2), format="json")
        .status_code
        == 201
    )
    over = api(lab["bo"]).post(
        "/api/reservations/", body(channel, lab["chat"], start + 3 * HOUR, 2), format="json"
    )
    assert (
        over.status_code == 400
        and "over group vision-lab's weekly quota on this channel" in over.data["message"]
    )
    assert (
        api(lab["bo"])
        .post("/api/reservations/", body(channel, lab["chat"], start + 3 * HOUR, 1), format="json")
        .status_code
        == 201
    )
    # Another group has its own hours.
    assert (
        api(lab["carl"])
        .post("/api/reservations/", body(channel, lab["chat"], start + 5 * HOUR, 3), format="json")
        .status_code
        == 201
    )


@pytest.mark.django_db(transaction=True)
def test_two_members_racing_for_the_groups_last_hour_one_wins():
    chat = factories.preset(factories.llm("qwen"), "chat")
    group = Group.objects.create(name="vision-lab")
    members = [factories.user(f"m{i}") for i in range(2)]
    for member in members:
        member.groups.add(group)
    channel = factories.channel("shared-0")
    channel.group_weekly_quota_hours = Decimal(2)
    channel.save()
    # Tomorrow at 10:00: the day's bookings three hours on stay on that day whenever the tests run.
    start = (timezone.now() + timedelta(days=1)).replace(hour=10, minute=0, second=0, microsecond=0)
    factories.reservation(owner=members[0], on=channel, start=start, end=start + HOUR, target=chat)

    def book(member, at):
        return lambda: (
            api(member).post("/api/reservations/", body(channel, chat, at), format="json").status_code
        )

    statuses = sorted(_race([book(members[0], start + 2 * HOUR), book(members[1], start + 4 * HOUR)]))
    assert statuses == [201, 400], statuses
    assert Reservation.objects.filter(channel=channel).count() == 2


def test_a_groups_approver_receives_and_decides_its_requests(lab, staff):
    channel = factories.channel("strict-0", policy="all")
    policy = GroupPolicy.objects.create(group=lab["vision"])
    policy.approvers.add(lab["bo"])
    # The hint names who decides: the group's approver, not "staff".
    asking = {
        "channel": channel.pk,
        "start": iso(lab["start"]),
        "end": iso(lab["start"] + HOUR),
        "model": "qwen",
    }
    hints = api(lab["ana"]).get("/api/reservations/hints", asking).data["warnings"]
    (approval,) = [w for w in hints if w["code"] == "approval_required"]
    assert approval["message"] == "bo (your group's approver) must approve this booking", approval
    asked = api(lab["ana"]).post(
        "/api/reservations/", body(channel, lab["chat"], lab["start"]), format="json"
    )
    assert asked.data["status"] == "pending"
    told = Notification.objects.filter(event="submitted")
    assert [n.user.username for n in told] == ["bo"], "the group's approver, not all staff"
    assert api(lab["carl"]).post(f"/api/reservations/{asked.data['id']}/approve").status_code == 404
    page = Client()
    page.force_login(lab["bo"])
    listed = page.get("/approvals/").content.decode()
    assert f'data-reservation="{asked.data["id"]}"' in listed and 'id="approvals-count">1<' in listed
    approved = api(lab["bo"]).post(f"/api/reservations/{asked.data['id']}/approve")
    assert approved.status_code == 200 and approved.data["status"] == "approved"
    # An approver's own request goes to... the other approvers, and they may not approve it themselves.
    own = api(lab["bo"]).post(
        "/api/reservations/", body(channel, lab["chat"], lab["start"] + 2 * HOUR), format="json"
    )
    assert api(lab["bo"]).post(f"/api/reservations/{own.data['id']}/approve").status_code == 403
    assert Notification.objects.get(event="submitted", key=f"submitted:{own.data['id']}").user == staff
    assert api(staff).post(f"/api/reservations/{own.data['id']}/approve").status_code == 200
    outsider = Client()
    outsider.force_login(lab["carl"])
    assert outsider.get("/approvals/").status_code == 403


def test_nobody_waits_for_a_channel_of_other_groups(lab):
    channel = factories.channel("vision-0")
    channel.allowed_groups.add(lab["vision"])
    factories.reservation(
        owner=lab["ana"], on=channel, start=lab["start"], end=lab["start"] + HOUR, target=lab["chat"]
    )
    wish = {"channel": channel.pk, "start": iso(lab["start"]), "end": iso(lab["start"] + HOUR)}
    refused = api(lab["carl"]).post("/api/waitlist/", wish, format="json")
    assert refused.status_code == 400 and "is for the groups vision-lab" in refused.data["message"]
    assert api(lab["bo"]).post("/api/waitlist/", wish, format="json").status_code == 201


def test_the_calendar_filters_by_group(lab):
    channel = factories.channel("shared-0")
    factories.reservation(
        owner=lab["ana"], on=channel, start=lab["start"], end=lab["start"] + HOUR, target=lab["chat"]
    )
    factories.reservation(
        owner=lab["carl"],
        on=channel,
        start=lab["start"] + 2 * HOUR,
        end=lab["start"] + 3 * HOUR,
        target=lab["chat"],
    )
    client = Client()
    client.force_login(lab["ana"])
    day = timezone.localtime(lab["start"]).date()
    page = client.get(f"/calendar/?day={day:%Y-%m-%d}&group={lab['nlp'].pk}").content.decode()
    assert '<span class="who">carl</span>' in page and '<span class="who">yours</span>' not in page
