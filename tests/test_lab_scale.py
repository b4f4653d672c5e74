"""A lab of a thousand: the pages and APIs read the same number of queries whatever the data's
size, and lists end (a page at a time, nearest first)."""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, cast

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from channels_app.models import Override
from gateway.models import RequestLog
from reservations.models import Reservation, ReservationStatus
from tests import factories

pytestmark = pytest.mark.django_db

_names = itertools.count()


def fill(channels: int, bookings_each: int, staff) -> dict[str, Any]:
    """``channels`` channels on nodes of four GPUs, each with a default, ``bookings_each``
    bookings this week by several people (some pending), overrides on a few, and some requests."""
    now = timezone.now()
    people = [factories.user(f"p{next(_names)}") for _ in range(5)]
    made = []
    for n in range(channels):
        tag = next(_names)
        if n % 4 == 0:
            node = factories.node(f"n{tag}", gpus=4)
        model = factories.llm(f"m{tag}")
        chat = factories.preset(model, "chat")
        channel = factories.channel(f"c{tag}", on=node, default=chat, gpu_indexes=[n % 4], policy="all")
        factories.load(chat, channel, started=now - timedelta(days=2), seconds=30)
        for b in range(bookings_each):
            start = now - timedelta(days=1) + timedelta(hours=3 * b)
            factories.reservation(
                owner=people[b % len(people)],
                on=channel,
                start=start,
                end=start + timedelta(hours=2),
                target=chat,
                status=ReservationStatus.PENDING
                if b % 3 == 0 and start > now
                else ReservationStatus.APPROVED,
            )
        if n % 3 == 0:
            Override.objects.create(channel=channel, model=model, preset=chat, until=now + timedelta(days=1))
        for r in range(bookings_each):
            RequestLog.objects.create(
                at=now - timedelta(hours=r),
                user=people[r % len(people)],
                channel=channel,
                model=model.name,
                method="POST",
                path="/v1/chat/completions",
                status=200,
                duration_ms=100.0,
                prompt_tokens=5,
                completion_tokens=7,
            )
        made.append(channel)
    return {"people": people, "channels": made, "staff": staff}


PAGES = [
    "/",
    "/calendar/",
    "/calendar/?view=week",
    "/reservations/",
    "/approvals/",
    "/usage/?by=user&period=week",
    "/usage/?by=channel&period=week",
]
APIS = ["/api/channels/", "/api/reservations/", "/api/nodes/", "/api/usage/?by=channel&period=week"]


def _queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        answer = client.get(url)
    assert answer.status_code == 200, (url, answer.status_code)
    return len(captured)


def _counts(staff) -> dict[str, int]:
    page, api = Client(), APIClient()
    page.force_login(staff)
    api.force_authenticate(staff)
    for url in PAGES:  # a first visit makes what a visitor keeps (their profile, time zone)
        page.get(url)
    counts = {url: _queries(page, url) for url in PAGES}
    counts.update({url: _queries(api, url) for url in APIS})
    return counts


def test_pages_and_apis_read_as_many_queries_for_a_larger_lab(staff):
    fill(2, 12, staff)
    small = _counts(staff)
    fill(10, 40, staff)  # six times the channels, about seventeen times the bookings
    large = _counts(staff)
    grew = {url: (small[url], large[url]) for url in small if large[url] != small[url]}
    assert grew == {}, f"queries that grow with the data (small, large): {grew}"
    assert max(large.values()) <= 40, large


def _half_hours(person, channel, starts, status) -> None:
    """Whole-card bookings of half an hour from each of ``starts``, in that order."""
    Reservation.objects.bulk_create(
        Reservation(
            user=person,
            channel=channel,
            start=start,
            end=start + timedelta(minutes=30),
            exclusive=True,
            status=status,
        )
        for start in starts
    )


def test_rest_lists_end_a_page_at_a_time(staff_api, staff):
    lab = fill(1, 1, staff)
    channel, person = lab["channels"][0], lab["people"][0]
    start = timezone.now() + timedelta(days=3)
    _half_hours(person, channel, [start + timedelta(hours=h) for h in range(250)], ReservationStatus.APPROVED)
    first = staff_api.get("/api/reservations/")
    assert first.status_code == 200 and isinstance(first.data, list) and len(first.data) == 100
    assert first["X-Total-Count"] == "251"
    assert 'rel="next"' in first["Link"] and "offset=100" in first["Link"]
    paged = staff_api.get("/api/reservations/?limit=50&offset=200")
    assert paged.data["count"] == 251 and len(paged.data["results"]) == 50
    # A time window: the bookings that overlap it.
    window = staff_api.get(
        "/api/reservations/",
        {"from": (start + timedelta(hours=10)).isoformat(), "to": (start + timedelta(hours=12)).isoformat()},
    )
    assert len(window.data) == 2, window.data
    assert staff_api.get("/api/reservations/", {"from": "yesterday"}).status_code == 400


def test_approvals_and_my_reservations_come_a_page_at_a_time_nearest_first(staff):
    lab = fill(1, 1, staff)
    channel, person = lab["channels"][0], lab["people"][0]
    start = timezone.now() + timedelta(days=1)
    farthest_first = [start + timedelta(hours=h) for h in range(120, 0, -1)]
    _half_hours(person, channel, farthest_first, ReservationStatus.PENDING)
    page = Client()
    page.force_login(staff)
    first = page.get("/approvals/")
    shown = list(first.context["pending"])
    assert len(shown) == 50 and shown == sorted(shown, key=lambda r: r.start)
    assert shown[0].start == start + timedelta(hours=1)
    last = page.get("/approvals/?page=3")
    assert len(list(last.context["pending"])) == 20
    mine = Client()
    mine.force_login(person)
    upcoming = list(mine.get("/reservations/").context["upcoming"])
    assert len(upcoming) == 50 and upcoming == sorted(upcoming, key=lambda r: r.start)


def test_the_calendar_feed_holds_a_window_not_every_booking_ever(staff):
    lab = fill(1, 1, staff)
    channel, person = lab["channels"][0], lab["people"][0]
    now = timezone.now()
    old = factories.reservation(
        owner=person, on=channel, start=now - timedelta(days=200), end=now - timedelta(days=200, hours=-1)
    )
    recent = factories.reservation(
        owner=person, on=channel, start=now - timedelta(days=20), end=now - timedelta(days=20, hours=-1)
    )
    from reservations.profiles import profile_for

    token = profile_for(person).calendar_token
    feed = Client().get(f"/calendar/{token}.ics").content.decode()
    assert f"reservation-{recent.pk}@" in feed and f"reservation-{old.pk}@" not in feed


@pytest.mark.django_db(transaction=True)
def test_the_request_log_csv_streams_under_asgi_as_rows_are_read(staff):
    """Served by ASGI, the export goes out in batches as the database hands them over (it once
    sent nothing until its last row), with the same rows the JSON list gives."""
    import asyncio

    from asgiref.sync import sync_to_async
    from django.http import StreamingHttpResponse
    from django.test import AsyncClient

    from gateway.api import CSV_FIELDS
    from slotserve_base.csv_stream import BATCH

    person = factories.user("streamer")
    now = timezone.now()
    RequestLog.objects.bulk_create(
        RequestLog(
            at=now - timedelta(seconds=n),
            user=person,
            model="=m" if n == 0 else "m",
            method="POST",
            path="/v1/chat/completions",
            status=200,
            duration_ms=1.5,
            prompt_tokens=n,
            completion_tokens=1,
        )
        for n in range(2 * BATCH + 10)
    )

    async def export() -> list[bytes]:
        client = AsyncClient()
        await sync_to_async(client.force_login)(staff)
        answer = await client.get("/api/requests/csv")
        assert answer.status_code == 200 and isinstance(answer, StreamingHttpResponse) and answer.is_async
        return [chunk async for chunk in cast(AsyncIterator[bytes], answer.streaming_content)]

    chunks = asyncio.run(export())
    assert len(chunks) == 4  # the header, then three batches
    rows = list(csv.reader(io.StringIO(b"".join(chunks).decode())))
    assert rows[0] == list(CSV_FIELDS) and len(rows) == 2 * BATCH + 11
    first = dict(zip(rows[0], rows[1], strict=True))
    assert first["user"] == "streamer" and first["model"] == "'=m" and first["at"].endswith("Z")
    assert first["prompt_tokens"] == "0" and first["duration_ms"] == "1.5"
