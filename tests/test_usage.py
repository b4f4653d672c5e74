"""Usage and utilisation: the counting (pure), and the page, CSV and API against the request log
after real traffic through the gateway."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from channels_app.models import Channel
from gateway.models import RequestLog
from gateway.usage.request_log import flush_request_log
from gateway.usage.utilisation import Demand, Span, channel_shares, minutes, shares_of, totals, totals_of
from slotserve_base.redis_client import redis_client
from tests import clock, factories
from tests.conftest import snapshot_seen
from tests.test_gateway_http import book, call
from tests.test_request_log import wait_for_records

T0 = clock.T0 + timedelta(hours=2)  # 10:00 UTC
MIN = timedelta(minutes=1)


def test_a_channels_hours_are_shared_out_and_add_up():
    lo, hi = T0, T0 + 240 * MIN
    bookings = [Span(T0 + 60 * MIN, T0 + 120 * MIN, 1, reservation_id=7)]
    requests = [
        Span(T0 + 70 * MIN, T0 + 80 * MIN, 1, reservation_id=7),  # the booker, 10 min
        Span(T0 + 150 * MIN, T0 + 165 * MIN, 1),  # everyone on the default, 15 min
        Span(T0 + 90 * MIN, T0 + 95 * MIN, 1),  # not the booker's, inside the booking: still unused by it
    ]
    loads = [Span(T0 + 55 * MIN, T0 + 62 * MIN, 1)]  # loading into the booking
    shares = channel_shares(bookings=bookings, requests=requests, loads=loads, lo=lo, hi=hi, now=hi)
    assert shares == {
        "switching": round(7 / 60, 2),
        "served_booker": round(10 / 60, 2),
        "lent": 0.0,  # the request inside the booking is not marked borrowed
        "booked_idle": round(48 / 60, 2),  # 60 booked − 2 loading − 10 served
        "served_default": 0.25,
        "idle": round((240 - 7 - 10 - 48 - 15) / 60, 2),
        "booked_to_come": 0.0,
    }
    assert abs(sum(shares.values()) - 4) < 0.03


def test_totals_count_used_minutes_per_booking_and_the_requests():
    bookings = [Span(T0, T0 + 60 * MIN, 1, user_id=1, reservation_id=7)]
    requests = [
        Span(T0 + 5 * MIN, T0 + 7 * MIN, 1, 1, 7, prompt=10, completion=20, ttft_ms=100),
        Span(T0 + 6 * MIN, T0 + 9 * MIN, 1, 1, 7, prompt=5, completion=5, ttft_ms=300),
        Span(T0 + 90 * MIN, T0 + 91 * MIN, 1, 1, None, prompt=1, completion=1),
    ]
    found = totals(bookings=bookings, requests=requests, lo=T0, hi=T0 + 120 * MIN, now=T0 + 120 * MIN)
    assert found.as_dict() == {
        "booked_hours": 1.0,
        "used_hours": round(4 / 60, 2),  # minutes 5–8 touched
        "idle_booked_hours": round(56 / 60, 2),
        "lent_hours": 0.0,
        "to_come_hours": 0.0,
        "requests": 3,
        "prompt_tokens": 16,
        "completion_tokens": 26,
        "ttft_ms": 200.0,
    }


@pytest.mark.django_db(transaction=True)
def test_usage_numbers_match_the_request_log_after_real_traffic(gateway_url, world, staff):
    Channel.objects.update(created=timezone.now() - timedelta(days=2))  # there all day
    booking = book(world, "ana")
    snapshot_seen(gateway_url)
    for _ in range(3):
        assert call(gateway_url, world.ana_key, max_tokens=4).status_code == 200  # in her booking
    assert call(gateway_url, world.bo_key, model="llama").status_code == 200  # on ch-b's default
    wait_for_records(4)
    flush_request_log(redis_client())
    logged = RequestLog.objects.filter(user=world.ana)
    today = timezone.localdate()
    ana = APIClient()
    ana.force_authenticate(world.ana)
    answer = ana.get("/api/usage/", {"by": "user", "period": "day", "day": today.isoformat()})
    assert answer.status_code == 200, answer.data
    (mine,) = answer.data["rows"]  # she sees herself only
    assert mine["name"] == "ana" and mine["requests"] == logged.count() == 3
    assert mine["prompt_tokens"] == sum(r.prompt_tokens for r in logged)
    assert mine["completion_tokens"] == sum(r.completion_tokens for r in logged)
    assert mine["used_hours"] > 0 and mine["booked_hours"] >= mine["used_hours"]
    held = (
        min(booking.end, timezone.now().replace(hour=23, minute=59)) - booking.start
    ).total_seconds() / 3600
    assert mine["booked_hours"] <= round(held, 2) + 0.02
    assert ana.get("/api/usage/", {"by": "channel"}).status_code == 403
    bad = ana.get("/api/usage/", {"by": "planet"})
    assert bad.status_code == 400 and "by" in bad.data
    assert ana.get("/api/usage/", {"day": "yesterday"}).status_code == 400

    boss = APIClient()
    boss.force_authenticate(staff)
    channels = boss.get("/api/usage/", {"by": "channel", "period": "day", "day": today.isoformat()}).data
    by_name = {r["name"]: r for r in channels["rows"]}
    assert by_name["ch-a"]["requests"] == 3 and by_name["ch-b"]["requests"] == 1
    shares = {r["name"]: r for r in channels["shares"]}
    assert shares["ch-a"]["served_booker"] > 0 and shares["ch-b"]["served_default"] > 0
    # The day's hours that passed are shared out; its bookings still to come are counted apart.
    midnight = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    passed = (timezone.now() - midnight).total_seconds() / 3600
    counted = sum(v for k, v in shares["ch-a"].items() if k not in ("id", "name", "booked_to_come"))
    assert abs(counted - passed) < 0.1 and shares["ch-a"]["booked_to_come"] > 0
    page = Client()
    page.force_login(world.ana)
    html = page.get("/usage/", {"period": "day", "day": today.isoformat()}).content.decode()
    figure = html.split('<figure class="chart">')[1].split("</figure>")[0]
    assert (
        figure.startswith("<svg") and "<script" not in figure and "ana" in figure
    )  # drawn here, runs nothing
    assert 'data-row="ana"' in html
    table = list(
        csv.reader(
            io.StringIO(page.get("/usage/csv", {"period": "day", "day": today.isoformat()}).content.decode())
        )
    )
    assert table[0][0] == "user" and table[1][0] == "ana" and int(table[1][table[0].index("requests")]) == 3


@pytest.mark.django_db
def test_the_report_read_in_runs_and_sums_gives_what_every_request_read_alone_gives(staff):
    """The report merges requests into runs and sums what they asked in the database; on random
    requests (touching, overlapping and apart, in and out of bookings, some borrowed, some before
    the period) its rows are what ``totals`` and ``channel_shares`` give over every request on its own."""
    import random

    from django.contrib.auth.models import Group

    from gateway.usage.reports import share_rows, usage_rows

    rng = random.Random(11)
    lo = datetime(2026, 3, 2, tzinfo=UTC)
    hi = lo + timedelta(days=1)
    people = [factories.user(f"u{n}") for n in range(3)]
    team = Group.objects.create(name="team")
    people[0].groups.add(team)
    people[1].groups.add(team)
    channels = [factories.channel(f"k{n}") for n in range(2)]
    Channel.objects.update(created=lo - timedelta(days=1))  # there all period
    bookings = []
    for n in range(4):
        start = lo + timedelta(hours=4 * n + 1)
        bookings.append(
            factories.reservation(
                owner=people[n % 3], on=channels[n % 2], start=start, end=start + timedelta(hours=2)
            )
        )
    rows = []
    for _ in range(400):
        at = lo - timedelta(minutes=50) + timedelta(seconds=rng.randrange(0, 26 * 3600))
        at += timedelta(microseconds=rng.choice([0, 0, 1, 999_999, rng.randrange(10**6)]))
        booking = rng.choice([None, *bookings])
        user = booking.user if booking else rng.choice(people)
        channel = booking.channel if booking else rng.choice(channels)
        borrowed = booking is not None and rng.random() < 0.3
        if borrowed:  # someone else's request in the booking's lent slot: it names no booking
            assert booking is not None
            at = booking.start + timedelta(seconds=rng.randrange(0, 2 * 3600))
            user = rng.choice([p for p in people if p != booking.user])
            booking = None
        rows.append(
            RequestLog(
                at=at,
                user=user,
                channel=channel,
                reservation=booking,
                borrowed=borrowed,
                model="m",
                method="POST",
                path="/v1/x",
                status=200,
                duration_ms=rng.choice([0.0, 200.0, 1_234.567, 5_000.0, 59_999.0, 60_000.0, 150_000.0]),
                ttft_ms=rng.choice([None, 12.5, 80.0]),
                prompt_tokens=rng.randrange(50),
                completion_tokens=rng.randrange(50),
            )
        )
    RequestLog.objects.bulk_create(rows)
    spans = [
        Span(
            r.at,
            r.at + timedelta(milliseconds=r.duration_ms),
            r.channel_id,
            r.user_id,
            r.reservation_id,
            r.prompt_tokens,
            r.completion_tokens,
            r.ttft_ms,
            borrowed=r.borrowed,
        )
        for r in rows
        if lo - timedelta(hours=1) <= r.at < hi
    ]
    held = [Span(b.start, b.end, b.channel_id, user_id=b.user_id, reservation_id=b.pk) for b in bookings]

    def alone(which: Any) -> dict[str, Any]:
        """``totals`` over the bookings and every request ``which`` picks, each on its own."""
        chosen = totals(
            bookings=[b for b in held if which(b)],
            requests=[s for s in spans if which(s)],
            lo=lo,
            hi=hi,
            now=hi,
            borrowed=[s for s in spans if s.borrowed],  # a slot's lent time is whoever borrowed it
        )
        return chosen.as_dict()

    def row(by: str, key: int) -> dict[str, Any]:
        return next(r for r in usage_rows(by=by, lo=lo, hi=hi, now=hi, viewer=staff) if r["id"] == key)

    for person in people:
        expected = alone(lambda s, pk=person.pk: s.user_id == pk)
        assert {k: row("user", person.pk)[k] for k in expected} == expected, person.username
    lent_somewhere = False
    for channel in channels:
        expected = alone(lambda s, pk=channel.pk: s.channel_id == pk)
        assert {k: row("channel", channel.pk)[k] for k in expected} == expected, channel.name
        shares = channel_shares(
            bookings=[b for b in held if b.channel_id == channel.pk],
            requests=[s for s in spans if s.channel_id == channel.pk],
            loads=[],
            lo=lo,
            hi=hi,
            now=hi,
        )
        found_shares = next(
            r for r in share_rows(lo=lo, hi=hi, now=hi, viewer=staff) if r["id"] == channel.pk
        )
        assert {k: found_shares[k] for k in shares} == shares, channel.name
        lent_somewhere = lent_somewhere or shares["lent"] > 0
    assert lent_somewhere  # the borrowed rows above fell in bookings: the lent share was compared
    grouped = alone(lambda s: s.user_id in (people[0].pk, people[1].pk))
    assert {k: row("group", team.pk)[k] for k in grouped} == grouped


def _logged(
    at: datetime, *, user, channel, booking=None, seconds: float = 30.0, tokens: int = 10
) -> RequestLog:
    return RequestLog(
        at=at,
        user=user,
        channel=channel,
        reservation=booking,
        model="m",
        method="POST",
        path="/v1/x",
        status=200,
        duration_ms=seconds * 1000,
        ttft_ms=50.0,
        prompt_tokens=tokens,
        completion_tokens=tokens,
    )


@pytest.mark.django_db
def test_the_report_reads_roll_ups_kept_as_the_log_is_written_and_counts_each_row_once(staff, ana):
    """Usage reads hourly sums and merged runs of minutes (``gateway.usage.rollups``), kept as the
    log is written: a second report counts nothing twice, rows written later that bridge two
    runs merge them, and the numbers stay after the log's rows are dropped."""
    from gateway.models import RequestHour, RequestMinutes
    from gateway.usage.reports import usage_rows

    channel = factories.channel("k")
    lo, hi = T0.replace(hour=0), T0.replace(hour=0) + timedelta(days=1)
    booking = factories.reservation(owner=ana, on=channel, start=T0, end=T0 + timedelta(hours=2))
    RequestLog.objects.bulk_create(
        [
            _logged(T0 + 1 * MIN, user=ana, channel=channel, booking=booking),  # minutes 1-2
            _logged(T0 + 10 * MIN, user=ana, channel=channel, booking=booking, seconds=90),  # 10-11
            _logged(T0 + timedelta(hours=5), user=ana, channel=channel),  # outside the booking
        ]
    )

    def ana_row() -> dict[str, Any]:
        return next(r for r in usage_rows(by="user", lo=lo, hi=hi, now=hi, viewer=staff) if r["id"] == ana.pk)

    first = ana_row()
    assert (first["requests"], first["prompt_tokens"], first["used_hours"]) == (3, 30, round(3 / 60, 2))
    assert RequestHour.objects.count() == 2 and RequestMinutes.objects.count() == 2
    assert ana_row() == first  # rolled up once: a second report adds nothing
    # A request written later, begun earlier, fills the minutes between the two.
    RequestLog.objects.create(
        **_fields(_logged(T0 + 2 * MIN, user=ana, channel=channel, booking=booking, seconds=8 * 60))
    )
    bridged = ana_row()
    assert bridged["requests"] == 4 and bridged["used_hours"] == round(11 / 60, 2)  # minutes 1 to 11
    stored = RequestMinutes.objects.get(reservation=booking)
    assert (stored.hour, stored.minutes) == (T0.timestamp() // 3600, (2**12 - 1) & ~1)  # minutes 1 to 11
    # The log's rows go (SLOTSERVE_REQUEST_LOG_DAYS); the report of their day stays the same.
    RequestLog.objects.all().delete()
    assert ana_row() == bridged


@pytest.mark.django_db
def test_a_weeks_report_reads_whole_days_from_the_daily_roll_ups(staff, ana, bo):
    """A week reads seven rows per user (or channel) from the daily roll-ups, not every hour's,
    and the minutes a day at a time: with the hourly roll-ups gone, the report is the same; the
    days per channel hold what the hours held."""
    from django.db.models import Sum

    from gateway.models import RequestDay, RequestHour, RequestMinutes
    from gateway.usage.reports import share_rows, usage_rows

    channel = factories.channel("k")
    lo = T0.replace(hour=0)
    hi = lo + timedelta(days=7)
    booking = factories.reservation(
        owner=ana, on=channel, start=lo + timedelta(hours=20), end=lo + timedelta(days=3)
    )
    logged = []
    for h in range(0, 7 * 24, 5):
        at = lo + timedelta(hours=h, minutes=7 + h % 50)
        mine = h % 3 != 0
        held = booking if mine and booking.start <= at < booking.end else None
        logged.append(
            _logged(
                at, user=ana if mine else bo, channel=channel, booking=held, tokens=h, seconds=h * 37 % 700
            )
        )
    RequestLog.objects.bulk_create(logged)

    def report() -> tuple[Any, ...]:
        return (
            usage_rows(by="user", lo=lo, hi=hi, now=hi, viewer=staff),
            usage_rows(by="channel", lo=lo, hi=hi, now=hi, viewer=staff),
            share_rows(lo=lo, hi=hi, now=hi, viewer=staff),
        )

    before = report()
    assert sum(r["requests"] for r in before[0]) == len(logged)
    assert next(r for r in before[0] if r["id"] == ana.pk)["used_hours"] > 0
    per_channel = RequestDay.objects.filter(per="channel").aggregate(
        n=Sum("requests"), p=Sum("prompt_tokens")
    )
    per_hour = RequestHour.objects.aggregate(n=Sum("requests"), p=Sum("prompt_tokens"))
    assert per_channel == per_hour
    RequestHour.objects.all().delete()
    RequestMinutes.objects.all().delete()
    assert report() == before


def test_the_daily_roll_ups_are_made_from_an_installations_hourly_ones(db, ana):
    """The migration that brings the daily roll-ups sums the hours already rolled up."""
    import importlib

    from django.apps import apps

    from gateway.models import RequestDay, RequestHour, RequestMinutes, RequestMinutesDay

    made = importlib.import_module("gateway.migrations.0012_request_day")
    channel = factories.channel("k")
    for h in (1, 2, 25):
        RequestHour.objects.create(
            hour=T0.replace(hour=0) + timedelta(hours=h),
            user=ana,
            channel=channel,
            requests=h,
            prompt_tokens=10,
        )
    made.from_the_hours(apps, None)
    minutes = importlib.import_module("gateway.migrations.0013_request_minutes_day")
    RequestMinutes.objects.create(hour=int(T0.timestamp() // 3600), channel=channel, minutes=0b110)
    RequestMinutes.objects.create(hour=int(T0.timestamp() // 3600) + 1, channel=channel, minutes=0b1)
    minutes.from_the_hours(apps, None)
    [(day, bits)] = RequestMinutesDay.objects.values_list("day", "minutes")
    shift = T0.hour * 60
    assert day == T0.date() and int.from_bytes(bits, "little") == (0b110 << shift) | (1 << (shift + 60))
    days = sorted(
        RequestDay.objects.values_list("day", "per", "user_id", "channel_id", "requests", "prompt_tokens")
    )
    first, second = T0.date(), T0.date() + timedelta(days=1)
    assert days == sorted(
        [
            (first, "user", ana.pk, None, 3, 20),
            (first, "channel", None, channel.pk, 3, 20),
            (second, "user", ana.pk, None, 25, 10),
            (second, "channel", None, channel.pk, 25, 10),
        ]
    )


def _fields(row: RequestLog) -> dict[str, Any]:
    return {f.attname: getattr(row, f.attname) for f in RequestLog._meta.concrete_fields if f.attname != "id"}


@pytest.mark.django_db
def test_a_day_that_begins_on_the_half_hour_sums_its_ends_from_the_log(staff, ana):
    """India's midnight is 18:30 UTC: the whole hours come from the roll-ups, the half hours at
    either end from the log; every request of the day counts, none of the days beside it."""
    from zoneinfo import ZoneInfo

    from gateway.usage.reports import period_bounds, usage_rows

    channel = factories.channel("k")
    lo, hi = period_bounds(T0.date(), "day", ZoneInfo("Asia/Kolkata"))
    assert lo.astimezone(UTC).minute == 30
    moments = [
        lo - MIN,
        lo,
        lo + 10 * MIN,
        lo + timedelta(hours=5),
        hi - 10 * MIN,
        hi - timedelta(seconds=1),
        hi,
    ]
    RequestLog.objects.bulk_create(
        [_logged(at, user=ana, channel=channel, tokens=n + 1) for n, at in enumerate(moments)]
    )
    row = next(r for r in usage_rows(by="user", lo=lo, hi=hi, now=hi, viewer=staff) if r["id"] == ana.pk)
    assert (row["requests"], row["prompt_tokens"]) == (5, 2 + 3 + 4 + 5 + 6)


@pytest.mark.django_db
def test_a_large_labs_usage_page_pages_its_table_and_charts_the_busiest(staff):
    """A thousand users do not make a thousand-bar chart and a thousand-row page: the chart shows
    the 25 with the most booked hours, the table 100 rows a page (the CSV has them all)."""
    import re

    from portal.usage import CHART_BARS, TABLE_PAGE

    channel = factories.channel("k")
    day = timezone.now().date() - timedelta(days=2)
    start = datetime.combine(day, datetime.min.time(), tzinfo=timezone.get_current_timezone())
    people = [factories.user(f"p{n:03d}") for n in range(130)]
    for n, person in enumerate(people):
        at = start + timedelta(minutes=10 * n)
        factories.reservation(owner=person, on=channel, start=at, end=at + timedelta(minutes=5 + n % 4))
    page = Client()
    page.force_login(staff)
    asked = {"by": "user", "period": "day", "day": day.isoformat()}
    first = page.get("/usage/", asked).content.decode()
    assert first.count('<tr data-row="') == TABLE_PAGE == 100
    chart = first[first.index("<svg") : first.index("</svg>")]
    labels = [name for name in (p.username for p in people) if f">{name}<" in chart]
    # The 25 with the most booked hours: those whose bookings are 8 minutes long (n % 4 == 3).
    assert len(labels) == CHART_BARS == 25 and all(int(name[1:]) % 4 == 3 for name in labels)
    assert "of 130" in chart
    later = re.search(r'href="\?([^"]*page=2[^"]*)"', first)
    assert later is not None and "by=user" in later.group(1) and f"day={day.isoformat()}" in later.group(1)
    second = page.get("/usage/?" + later.group(1).replace("&amp;", "&")).content.decode()
    assert second.count('<tr data-row="') == 30
    rows = list(csv.reader(io.StringIO(page.get("/usage/csv", asked).content.decode())))
    assert len(rows) == 1 + 130


def test_time_still_to_come_is_neither_booked_nor_idle_yet():
    """A booking from 10:00 to 13:00 read at 11:00: one hour booked (and idle: no requests), two
    still to come; the channel's shares count only the hour that passed, and the booked future."""
    bookings = [Span(T0, T0 + 180 * MIN, 1, user_id=1, reservation_id=7)]
    requests = [Span(T0 + 5 * MIN, T0 + 7 * MIN, 1, 1, 7)]
    now = T0 + 60 * MIN
    found = totals(bookings=bookings, requests=requests, lo=T0, hi=T0 + 240 * MIN, now=now)
    assert (found.booked_hours, found.used_hours, found.idle_booked_hours, found.to_come_hours) == (
        1.0,
        round(2 / 60, 2),
        round(58 / 60, 2),
        2.0,
    )
    shares = channel_shares(bookings=bookings, requests=requests, loads=[], lo=T0, hi=T0 + 240 * MIN, now=now)
    assert shares["booked_idle"] == round(58 / 60, 2) and shares["booked_to_come"] == 2.0
    assert shares["idle"] == 0.0  # the hour after the booking has not come yet either
    assert abs(sum(shares.values()) - 3) < 0.03  # the hour that passed and the booked two to come


def test_a_chart_is_drawn_once_for_the_same_numbers_and_again_when_they_change(monkeypatch):
    """Drawing costs more than counting: colleagues looking at the same numbers share a drawing."""
    import pygal
    from django.core.cache import cache

    from portal.usage import hours_chart

    cache.clear()
    drawn: list[str] = []
    real_render = pygal.Bar.render

    def counted(chart: Any, *args: Any, **kwargs: Any) -> Any:
        drawn.append(chart.title)
        return real_render(chart, *args, **kwargs)

    monkeypatch.setattr(pygal.Bar, "render", counted)
    rows = [
        {"name": "ana", "booked_hours": 2.0, "used_hours": 1.5, "to_come_hours": 0.0, "requests": 4},
        {"name": "bo", "booked_hours": 1.0, "used_hours": 0.25, "to_come_hours": 3.0, "requests": 1},
    ]
    first = hours_chart(rows, "user")
    assert hours_chart([dict(r) for r in rows], "user") == first and len(drawn) == 1
    rows[1]["used_hours"] = 0.5
    changed = hours_chart(rows, "user")
    assert len(drawn) == 2 and changed != first


def test_a_lent_slots_time_that_colleagues_used_is_lent_not_idle_booked():
    """The per-person table as the shares chart sees it: the booker's idle minutes that borrowers
    used are lent, not "booked, unused"."""
    lo, hi = T0, T0 + 120 * MIN
    booking = Span(T0, T0 + 60 * MIN, channel_id=5, user_id=1, reservation_id=1)
    counted = totals_of(
        bookings=[booking],
        ran={1: minutes(T0, T0 + 10 * MIN, lo, hi)},  # the booker's own requests: 10 minutes
        lent={
            5: minutes(T0 + 5 * MIN, T0 + 30 * MIN, lo, hi)
        },  # borrowers': 25, 5 of them beside the booker's
        asked=Demand(),
        lo=lo,
        hi=hi,
        now=hi,
    )
    assert (counted.booked_hours, counted.used_hours) == (1.0, round(10 / 60, 2))
    assert counted.lent_hours == round(20 / 60, 2) and counted.idle_booked_hours == round(30 / 60, 2)
    assert "lent_hours" in counted.as_dict()


def test_a_charts_legend_says_each_series_whole():
    """The legend names every series in full: "lent while the booker was idle", not "lent whil…"."""
    from django.core.cache import cache

    from gateway.usage.utilisation import SHARES
    from portal.usage import SHARE_LABELS, hours_chart, shares_chart

    cache.clear()
    shares = shares_chart([{"name": "a100-0", **{share: 1.0 for share in SHARES}}])
    for label in SHARE_LABELS.values():
        assert f">{label}</text>" in shares, label
    hours = hours_chart(
        [{"name": "ana", "booked_hours": 1.0, "used_hours": 1.0, "to_come_hours": 0.0, "requests": 1}], "user"
    )
    assert ">used by the booker's requests</text>" in hours.replace("&#x27;", "'").replace("&#39;", "'")


def test_a_channel_added_in_the_period_counts_its_time_from_when_it_was_added():
    """A channel made minutes ago was not idle all week: its shares start when it was added."""
    lo, hi = T0, T0 + 7 * 24 * 60 * MIN
    added, now = T0 + 3 * 24 * 60 * MIN, T0 + 3 * 24 * 60 * MIN + 30 * MIN
    shares = shares_of(switching=0, booked=0, booker=0, default=0, lo=lo, hi=hi, now=now, since=added)
    assert shares["idle"] == 0.5 and sum(shares.values()) == 0.5


@pytest.mark.django_db
def test_the_usage_page_counts_a_new_channels_time_from_when_it_was_added(staff):
    channel = factories.channel("new-0")
    channel.created = timezone.now() - 20 * MIN
    channel.save()
    page = Client()
    page.force_login(staff)
    answer = page.get("/api/usage/", {"by": "channel", "period": "week"})
    assert answer.status_code == 200, answer.content
    (shares,) = [row for row in answer.json()["shares"] if row["name"] == "new-0"]
    assert shares["idle"] <= 0.35, shares  # 20 minutes, not the week so far
