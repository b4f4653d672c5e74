"""The approvals page (docs/portal.md): each request among the bookings around it, several approved
or rejected at once with one reason."""

from __future__ import annotations

from datetime import datetime, time, timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from reservations.models import Reservation, ReservationStatus
from tests import factories
from tests.clock import PORTAL_T0
from tests.factories import client_for
from tests.test_browser import CHROMIUM, browser, sign_in  # noqa: F401  (browser: a fixture)

HOUR = timedelta(hours=1)

needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Chromium (apt-get install chromium)"
)


def tomorrow_at(hour: int) -> datetime:
    day = (timezone.localtime() + timedelta(days=1)).date()
    return datetime.combine(day, time(hour), tzinfo=timezone.get_current_timezone())


@pytest.mark.django_db(transaction=True)
def test_approvals_date_the_neighbours_and_reject_the_ticked_with_one_reason():
    from datetime import datetime, time

    boss = factories.user("boss", staff=True)
    ana, bo = factories.user("ana"), factories.user("bo")
    channel = factories.channel("a100-0", policy="all")
    day = (timezone.localtime() + timedelta(days=2)).date()
    start = datetime.combine(day, time(10), tzinfo=timezone.get_current_timezone())
    # bo's booking is on the day before: it is no clash, and the page must not read like one.
    before = start - timedelta(hours=20)
    factories.reservation(owner=bo, on=channel, start=before, end=before + timedelta(hours=1))
    asks = [
        factories.reservation(
            owner=ana,
            on=channel,
            start=start + timedelta(hours=2 * n),
            end=start + timedelta(hours=2 * n + 1),
            status=ReservationStatus.PENDING,
        )
        for n in range(3)
    ]
    client = Client()
    client.force_login(boss)
    page = client.get("/approvals/").content.decode()
    row = page.split(f'id="reservation-{asks[0].pk}"')[1].split("</tr>")[0]
    local = timezone.localtime(before)
    assert f"bo {local:%a} {local.day} {local:%b} {local:%H:%M}–" in row, row
    assert 'id="tick-all"' in page and "Reject the ticked" in page
    # Without a reason nothing is rejected, and the page says what is missing.
    refused = client.post("/approvals/reject", {"reservation": [asks[0].pk, asks[2].pk]}, follow=True)
    assert "Say why" in refused.content.decode()
    assert {r.status for r in Reservation.objects.filter(pk__in=[a.pk for a in asks])} == {"pending"}
    done = client.post(
        "/approvals/reject",
        {"reservation": [asks[0].pk, asks[2].pk], "reason": "the GPU is in repair"},
        follow=True,
    )
    assert "2 rejected." in done.content.decode()
    found = {r.pk: r for r in Reservation.objects.filter(pk__in=[a.pk for a in asks])}
    assert [found[a.pk].status for a in asks] == ["rejected", "pending", "rejected"]
    assert found[asks[0].pk].reject_reason == "the GPU is in repair"
    stranger = Client()
    stranger.force_login(bo)
    assert (
        stranger.post("/approvals/reject", {"reservation": [asks[1].pk], "reason": "no"}).status_code == 403
    )


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_approvals_tick_all_at_once(browser, live_server):  # noqa: F811
    factories.user("boss", staff=True)
    ana = factories.user("ana")
    channel = factories.channel("a100-0", policy="all")
    start = timezone.now() + timedelta(days=1)
    for n in range(3):
        at = start + timedelta(hours=2 * n)
        factories.reservation(
            owner=ana, on=channel, start=at, end=at + timedelta(hours=1), status=ReservationStatus.PENDING
        )
    page = sign_in(browser, live_server, "boss")
    page.goto(f"{live_server.url}/approvals/")
    page.check("#tick-all")
    assert page.locator("input[name=reservation]:checked").count() == 3
    page.uncheck("#tick-all")
    assert page.locator("input[name=reservation]:checked").count() == 0


@pytest.mark.django_db(transaction=True)
def test_approvers_see_each_request_among_its_neighbours_and_approve_several_at_once():
    from reservations.models import Notification

    boss = factories.user("boss", staff=True)
    ana, bo = factories.user("ana"), factories.user("bo")
    channel = factories.channel("a100-0", policy="all")
    start = tomorrow_at(10)
    held = factories.reservation(
        owner=bo, on=channel, start=start - timedelta(hours=2), end=start - timedelta(hours=1)
    )
    asks = [
        factories.reservation(
            owner=ana,
            on=channel,
            start=start + timedelta(hours=2 * n),
            end=start + timedelta(hours=2 * n + 1),
            status="pending",
        )
        for n in range(3)
    ]
    client = Client()
    client.force_login(boss)
    page = client.get("/approvals/").content.decode()
    row = page.split(f'id="reservation-{asks[0].pk}"')[1].split("</tr>")[0]
    assert f"bo {start:%a} {start.day} {start:%b} 08:00–09:00" in row  # what is around it, dated
    assert f"/calendar/?day={start:%Y-%m-%d}" in row
    answer = client.post("/approvals/approve", {"reservation": [asks[0].pk, asks[2].pk]})
    assert answer.status_code == 302
    assert [Reservation.objects.get(pk=r.pk).status for r in asks] == ["approved", "pending", "approved"]
    assert Notification.objects.filter(user=ana, event="approved").count() == 2
    assert held.pk not in {r.pk for r in asks}
    # Someone who approves nothing gets nothing of it.
    stranger = Client()
    stranger.force_login(bo)
    assert stranger.post("/approvals/approve", {"reservation": [asks[1].pk]}).status_code == 403
    assert Reservation.objects.get(pk=asks[1].pk).status == "pending"


def test_approvals_page_is_for_staff(portal, ana, bo, staff):
    portal.channel.approval_policy = "all"
    portal.channel.save()
    pending = factories.reservation(
        owner=bo,
        on=portal.channel,
        start=PORTAL_T0 + 2 * HOUR,
        end=PORTAL_T0 + 3 * HOUR,
        target=portal.preset,
        status="pending",
    )
    assert client_for(ana).get("/approvals/").status_code == 403  # staff and group approvers only
    page = client_for(staff).get("/approvals/").content.decode()
    assert f'data-reservation="{pending.pk}"' in page
    assert 'id="approvals-count">1<' in page
    client_for(staff).post(f"/approvals/{pending.pk}/reject", {"reason": "GPU maintenance"})
    pending.refresh_from_db()
    assert (pending.status, pending.reject_reason) == ("rejected", "GPU maintenance")
