"""A backlog of the request log (a restore, an import of old logs: many rows written at once, in
no time order) is folded into usage's roll-ups by the catch-up in hour order, a bounded window at
a time, in the background; pages and the API answer meanwhile and say how far it has come."""

from __future__ import annotations

import io
import itertools
import random
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db.models import Sum
from django.test import Client
from rest_framework.test import APIClient

from gateway.models import (
    RequestDay,
    RequestHour,
    RequestLog,
    RequestMinutes,
    RequestMinutesDay,
    RollupMark,
)
from gateway.usage import rollups
from slotserve_base import dispatch
from tests import factories
from tests.test_usage import T0, _logged

pytestmark = pytest.mark.django_db
ROWS = 600


@pytest.fixture
def backlog(settings, ana, bo):
    """600 requests over ten days, written at once in no time order; more than 100 rows is a backlog."""
    settings.SLOTSERVE_USAGE_BACKLOG_ROWS = 100
    rng = random.Random(5)
    channel = factories.channel("k")
    booking = factories.reservation(owner=ana, on=channel, start=T0, end=T0 + timedelta(days=2))
    rows = []
    for _ in range(ROWS):
        at = T0 + timedelta(seconds=rng.randrange(10 * 24 * 3600))
        who = rng.choice([ana, bo])
        rows.append(
            _logged(
                at,
                user=who,
                channel=channel,
                booking=booking if who == ana and at < booking.end else None,
                seconds=rng.choice([0.5, 30, 200, 4000]),
                tokens=rng.randrange(1, 50),
            )
        )
    RequestLog.objects.bulk_create(rows)
    return channel


@pytest.fixture
def sent(monkeypatch):
    """The tasks sent, not run: the catch-up is the background's."""
    names: list[str] = []
    monkeypatch.setattr(dispatch, "send_quietly", lambda name, **options: names.append(name))
    return names


def rolled_up() -> tuple[list[tuple[Any, ...]], ...]:
    hours = sorted(
        RequestHour.objects.values_list(
            "hour", "user_id", "channel_id", "requests", "prompt_tokens", "completion_tokens", "ttft_count"
        )
    )
    days = sorted(
        RequestDay.objects.values_list("day", "per", "user_id", "channel_id", "requests", "prompt_tokens"),
        key=repr,
    )
    minutes = sorted(
        RequestMinutes.objects.values_list("hour", "channel_id", "reservation_id", "user_id", "minutes"),
        key=repr,
    )
    minute_days = sorted(
        (
            (day, channel, booking, user, bytes(bits))
            for day, channel, booking, user, bits in RequestMinutesDay.objects.values_list(
                "day", "channel_id", "reservation_id", "user_id", "minutes"
            )
        ),
        key=repr,
    )
    return hours, days, minutes, minute_days


def folded_in_one_go(settings) -> tuple[list[tuple[Any, ...]], ...]:
    """What the roll-ups hold when every row is folded in the order it was written, no backlog."""
    for model in (RequestHour, RequestDay, RequestMinutes, RequestMinutesDay, RollupMark):
        model.objects.all().delete()
    settings.SLOTSERVE_USAGE_BACKLOG_ROWS = 10**9
    rollups.roll_up()
    return rolled_up()


def test_a_report_after_a_backlog_answers_at_once_and_says_it_is_catching_up(
    backlog, staff, sent, django_capture_on_commit_callbacks
):
    viewer = Client()
    viewer.force_login(staff)
    with django_capture_on_commit_callbacks(execute=True):
        page = viewer.get(f"/usage/?by=user&period=week&day={T0.date()}")
    assert page.status_code == 200
    assert "Usage is being brought up to date (0 %)" in page.content.decode()
    # Nothing of the backlog was folded inside the request; the catch-up was sent, once.
    assert RequestHour.objects.count() == 0 and sent == [dispatch.CATCH_UP_USAGE]
    mark = RollupMark.objects.get()
    assert (mark.backlog_rows, mark.backlog_done) == (ROWS, 0)
    api = APIClient()
    api.force_authenticate(staff)
    answer = api.get(f"/api/usage/?by=channel&period=week&day={T0.date()}").json()
    assert answer["catching_up"] == 0.0
    rollups.catch_up(rows=100, windows=2)
    assert 0 < api.get(f"/api/usage/?by=channel&period=week&day={T0.date()}").json()["catching_up"] < 1
    rollups.catch_up()
    answer = api.get(f"/api/usage/?by=channel&period=week&day={T0.date()}").json()
    assert answer["catching_up"] is None
    assert (
        "brought up to date"
        not in viewer.get(f"/usage/?by=user&period=week&day={T0.date()}").content.decode()
    )


def test_the_catch_up_folds_each_row_once_in_hour_order_a_bounded_window_at_a_time(
    backlog, sent, monkeypatch, settings, ana
):
    rollups.roll_up()  # sets the backlog aside
    windows: list[list[Any]] = []
    fold_rows = rollups._fold_rows

    def watched(rows):
        windows.append([row[1] for row in rows])
        fold_rows(rows)

    monkeypatch.setattr(rollups, "_fold_rows", watched)
    first = rollups.catch_up(rows=50, windows=3)  # a slice that ran out of time
    assert not first.finished and 0 < first.done < ROWS
    # Meanwhile the flush writes new rows past the backlog: folded at once, as always.
    RequestLog.objects.bulk_create([_logged(T0 + timedelta(minutes=2), user=ana, channel=backlog)])
    assert rollups.roll_up() == 1
    assert windows.pop() == [T0 + timedelta(minutes=2)]  # the new row alone
    while not rollups.catch_up(rows=50).finished:
        pass
    assert sum(map(len, windows)) == ROWS  # every row of the backlog, once (the new one apart)
    assert max(map(len, windows)) <= 100  # at most twice the window's rows in memory
    for before, after in itertools.pairwise(windows):
        assert max(before) < min(after)  # hour order: each window wholly before the next
    assert RollupMark.objects.get().catching_up is None
    caught = rolled_up()
    monkeypatch.setattr(rollups, "_fold_rows", fold_rows)
    assert caught == folded_in_one_go(settings)


def test_a_lost_catch_up_is_sent_again_and_the_command_catches_the_backlog_up(backlog, sent):
    from gateway.tasks import keep_catching_up
    from slotserve_base.redis_client import redis_client
    from slotserve_base.vocabulary import RedisKey, redis_key

    client = redis_client()
    client.delete(redis_key(RedisKey.USAGE_CATCH_UP, "alive"))
    rollups.roll_up()
    # The task sent with the backlog was lost: the next flush sends it again, once while it lives.
    keep_catching_up(client)
    keep_catching_up(client)
    assert sent == [dispatch.CATCH_UP_USAGE]
    out = io.StringIO()
    call_command("catch_up_usage", stdout=out)
    assert f"usage is up to date ({ROWS} rows of backlog folded)" in out.getvalue()
    assert RollupMark.objects.get().catching_up is None
    assert RequestHour.objects.aggregate(n=Sum("requests"))["n"] == ROWS
    keep_catching_up(client)  # nothing waits: nothing sent
    assert sent == [dispatch.CATCH_UP_USAGE]


@pytest.mark.django_db(transaction=True)
def test_a_usage_page_does_not_wait_for_a_window_of_the_catch_up(backlog, staff, sent):
    """A window of the catch-up holds the roll-ups' mark while it folds (a second or two of a
    large backlog); a report rolling up first waited for it, and the usage pages answered in
    1.3-2.0 s all through a catch-up (bench/portal_load.py). They read what is folded so far
    and say so; the rows flushed meanwhile are folded by their flush."""
    import threading

    from django.db import connection, transaction

    if connection.vendor != "postgresql":
        pytest.skip("the tests' SQLite database is one in memory whose readers wait for its writer")
    rollups.roll_up()  # the backlog set aside
    holding, release, gave_up = threading.Event(), threading.Event(), threading.Event()

    def window() -> None:
        try:
            with transaction.atomic():
                rollups.lock_mark()  # as a window of the catch-up holds it while it folds
                holding.set()
                if not release.wait(10):
                    gave_up.set()
        finally:
            connection.close()

    holder = threading.Thread(target=window)
    holder.start()
    try:
        assert holding.wait(10)
        viewer = Client()
        viewer.force_login(staff)
        page = viewer.get(f"/usage/?by=user&period=week&day={T0.date()}")
        api = APIClient()
        api.force_authenticate(staff)
        answer = api.get(f"/api/usage/?by=channel&period=week&day={T0.date()}")
        assert not gave_up.is_set(), "the page waited for the window to end"
    finally:
        release.set()
        holder.join()
    assert page.status_code == 200 and "Usage is being brought up to date" in page.content.decode()
    assert answer.status_code == 200 and answer.json()["catching_up"] == 0.0
