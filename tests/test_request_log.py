"""The request log: one row per request through the gateway, written in batches from Redis,
seen by its owner (staff: everyone's) in the API, as CSV and in the portal, kept for
``SLOTSERVE_REQUEST_LOG_DAYS``."""

from __future__ import annotations

import csv
import io
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from gateway.models import RequestLog
from gateway.usage.request_log import flush_request_log
from slotserve_base.redis_client import redis_client
from tests.clock import eventually
from tests.conftest import snapshot_seen
from tests.test_gateway_http import book, call

pytestmark = pytest.mark.django_db(transaction=True)


def wait_for_records(count: int) -> None:
    """The gateway pushes a request's record right after the answer went out: wait for them."""
    from slotserve_base.vocabulary import RedisKey, redis_key

    pushed = redis_key(RedisKey.REQUEST_LOG, "all")
    assert eventually(lambda: redis_client().llen(pushed) >= count, timeout=5), (
        "the gateway did not push its records"
    )


def api_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_every_request_is_one_row_written_off_the_hot_path(gateway_url, world, staff):
    assert call(gateway_url, world.ana_key, max_tokens=4).status_code == 200
    streamed = call(gateway_url, world.ana_key, model="llama", stream=True)
    assert streamed.status_code == 200
    assert call(gateway_url, world.bo_key, model="mistral").status_code == 404
    assert call(gateway_url, "ss-not-a-key").status_code == 401  # nobody to log it for
    book(world, "ana")
    snapshot_seen(gateway_url)
    assert call(gateway_url + "/channels/ch-a", world.bo_key).status_code == 403
    wait_for_records(4)
    assert RequestLog.objects.count() == 0  # nothing written while answering
    assert flush_request_log(redis_client()) == 4
    assert flush_request_log(redis_client()) == 0  # each record once

    rows = list(RequestLog.objects.order_by("at", "pk"))
    first, second, missing, refused = rows
    assert (first.user, first.channel, first.model, first.path, first.status) == (
        world.ana,
        world.channel,
        "qwen",
        "/v1/chat/completions",
        200,
    )
    assert first.key is not None and first.key.user == world.ana
    assert first.prompt_tokens > 0 and first.completion_tokens > 0
    assert first.ttft_ms is not None and first.duration_ms >= first.ttft_ms > 0
    assert (second.channel, second.model, second.status) == (world.other, "llama", 200)
    assert second.completion_tokens > 0  # counted from the stream's usage
    assert (missing.user, missing.channel, missing.status, missing.model) == (
        world.bo,
        None,
        404,
        "mistral",
    )
    assert (refused.path, refused.status, refused.channel) == (
        "/channels/ch-a/v1/chat/completions",
        403,
        world.channel,  # the channel it was for
    )


def test_owners_see_their_rows_staff_see_all_with_filters_and_csv(gateway_url, world, staff):
    call(gateway_url, world.ana_key)
    call(gateway_url, world.bo_key, model="llama")
    call(gateway_url, world.bo_key, model="nothing")
    wait_for_records(3)
    flush_request_log(redis_client())

    mine = api_for(world.bo).get("/api/requests/").data
    assert mine["count"] == 2 and {r["user"] for r in mine["results"]} == {"bo"}
    assert api_for(world.bo).get("/api/requests/", {"user": "ana"}).data["count"] == 0
    everyone = api_for(staff)
    assert everyone.get("/api/requests/").data["count"] == 3
    assert everyone.get("/api/requests/", {"user": "ana"}).data["results"][0]["channel"] == "ch-a"
    assert everyone.get("/api/requests/", {"status": 404}).data["results"][0]["model"] == "nothing"
    assert everyone.get("/api/requests/", {"channel": "ch-b"}).data["count"] == 1
    bad = everyone.get("/api/requests/", {"status": "many"})
    assert bad.status_code == 400 and "status" in bad.data
    exported = everyone.get("/api/requests/csv", {"user": "bo"})
    assert exported.status_code == 200 and exported["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(b"".join(exported.streaming_content).decode())))  # type: ignore[attr-defined]
    assert len(table) == 2 and {row["user"] for row in table} == {"bo"}
    assert {row["status"] for row in table} == {"200", "404"}

    portal = Client()
    portal.force_login(world.bo)
    page = portal.get("/requests/").content.decode()
    assert "nothing" in page and "<td>qwen" not in page  # bo's own rows only (not ana's qwen)


def test_rows_older_than_the_retention_go_at_the_next_flush(settings, ana):
    settings.SLOTSERVE_REQUEST_LOG_DAYS = 30
    now = timezone.now()
    for days in (31, 29):
        RequestLog.objects.create(
            at=now - timedelta(days=days), user=ana, path="/v1/chat/completions", status=200, duration_ms=5
        )
    flush_request_log(redis_client(), now=now)
    assert list(RequestLog.objects.values_list("at", flat=True)) == [now - timedelta(days=29)]


def test_records_of_deleted_users_and_keys_are_kept_as_far_as_they_exist(gateway_url, world):
    call(gateway_url, world.bo_key, model="llama")
    call(gateway_url, world.ana_key)
    wait_for_records(2)
    from gateway.models import ApiKey

    ApiKey.objects.filter(user=world.ana).delete()
    world.bo.delete()
    assert flush_request_log(redis_client()) == 1
    row = RequestLog.objects.get()
    assert row.user == world.ana and row.key is None


def test_a_database_that_fails_keeps_the_records_for_the_next_flush(gateway_url, world, monkeypatch):
    call(gateway_url, world.ana_key)
    wait_for_records(1)
    from django.db import DatabaseError

    def broken(*args, **kwargs):
        raise DatabaseError("the database went away")

    with monkeypatch.context() as patched:
        patched.setattr(RequestLog.objects, "bulk_create", broken)
        with pytest.raises(DatabaseError):
            flush_request_log(redis_client())
    assert flush_request_log(redis_client()) == 1


def test_a_record_that_reaches_redis_twice_is_one_row(gateway_url, world):
    """A count out sent again after its reply was lost (Redis away: ``gateway.wire.counters``)
    may push its record twice: the request's id makes it one row."""
    from slotserve_base.vocabulary import RedisKey, redis_key

    call(gateway_url, world.ana_key)
    wait_for_records(1)
    pushed = redis_key(RedisKey.REQUEST_LOG, "all")
    redis_client().rpush(pushed, redis_client().lindex(pushed, 0))
    flush_request_log(redis_client())
    assert RequestLog.objects.count() == 1
    assert RequestLog.objects.get().request_id


def test_a_flush_that_could_not_take_its_batch_off_redis_writes_it_once(gateway_url, world, monkeypatch):
    """Rows saved, then Redis gone before the batch left its list: the next flush finds the same
    records and writes none of them again."""
    import redis as redis_py

    call(gateway_url, world.ana_key)
    call(gateway_url, world.bo_key, model="llama")
    wait_for_records(2)
    client = redis_client()
    with monkeypatch.context() as patched:

        def lost(*args, **kwargs):
            raise redis_py.ConnectionError("Redis went away")

        patched.setattr(client, "ltrim", lost)
        with pytest.raises(redis_py.ConnectionError):
            flush_request_log(client)
    assert RequestLog.objects.count() == 2
    flush_request_log(client)
    assert RequestLog.objects.count() == 2


def test_the_log_records_the_model_that_served_beside_the_name_sent(gateway_url, world):
    """A booker's request naming any model is served by their booking's; the log says both."""
    book(world, "ana")
    snapshot_seen(gateway_url)
    assert call(gateway_url, world.ana_key, model="llama-70b").status_code == 200
    assert call(gateway_url, world.bo_key, model="llama").status_code == 200
    wait_for_records(2)
    flush_request_log(redis_client())
    rows = set(RequestLog.objects.values_list("user__username", "model", "served_model"))
    assert rows == {("ana", "llama-70b", "qwen"), ("bo", "llama", "llama")}


def test_records_written_before_the_served_model_was_kept_still_flush(ana):
    """An upgrade finds the old records (13 fields) in Redis: they are written, served unknown."""
    import json

    from slotserve_base.vocabulary import RedisKey, redis_key

    old = json.dumps([time.time(), ana.pk, None, None, None, "qwen", "POST", "/v1/x", 200, None, 1.0, 1, 2])
    redis_client().rpush(redis_key(RedisKey.REQUEST_LOG, "all"), old)
    assert flush_request_log(redis_client()) == 1
    assert RequestLog.objects.get().served_model == ""


def test_records_written_before_decisions_were_timed_still_flush(ana):
    """An upgrade finds records of 16 fields in Redis: written, with no decision time."""
    import json

    from slotserve_base.vocabulary import RedisKey, redis_key

    fields = [
        time.time(),
        ana.pk,
        None,
        None,
        None,
        "qwen",
        "POST",
        "/v1/x",
        200,
        None,
        1.0,
        1,
        2,
        "qwen",
        None,
    ]
    redis_client().rpush(redis_key(RedisKey.REQUEST_LOG, "all"), json.dumps([*fields, "r-16"]))
    assert flush_request_log(redis_client()) == 1
    row = RequestLog.objects.get()
    assert (row.request_id, row.decided_ms) == ("r-16", None)


def test_two_flushes_at_once_write_each_record_once(ana, monkeypatch):
    """After a database outage the flushes that waited for it run together (the scheduler's
    worker runs two at once): each record is still one row (a lab's week under faults found
    answers logged twice)."""
    import contextlib
    import json
    import threading

    from django.db import connection

    from gateway.usage import request_log
    from slotserve_base.vocabulary import RedisKey, redis_key

    records = [
        json.dumps(
            [time.time(), ana.pk, None, None, None, "qwen", "POST", "/v1/x", 200, None, 1.0, 1, 2, "q", None]
        )
        for _ in range(5)
    ]
    redis_client().rpush(redis_key(RedisKey.REQUEST_LOG, "all"), *records)
    parse = request_log._rows
    both_read = threading.Barrier(2, timeout=2)

    def slow_rows(raw):
        rows = parse(raw)
        # The second flush reads the same batch meanwhile, or (as it should) leaves it to this one.
        with contextlib.suppress(threading.BrokenBarrierError):
            both_read.wait()
        return rows

    monkeypatch.setattr(request_log, "_rows", slow_rows)

    def flush() -> None:
        flush_request_log(redis_client())
        connection.close()

    flushes = [threading.Thread(target=flush) for _ in range(2)]
    for thread in flushes:
        thread.start()
    for thread in flushes:
        thread.join(timeout=30)
    assert RequestLog.objects.count() == 5


def test_a_flush_that_died_holding_the_lock_holds_up_the_log_only_briefly(ana, monkeypatch):
    """The scheduler's worker killed mid-flush leaves the flush's lock behind: it lapses within
    ``FLUSH_LOCK_SECONDS`` (10 s), not after a task's whole limit (the chaos week saw half a
    day's records wait in Redis after such a kill)."""
    import json

    from gateway.usage import request_log
    from slotserve_base.vocabulary import RedisKey, redis_key

    lock = redis_key(RedisKey.REQUEST_LOG, "flushing")
    seen: list[int] = []
    flush = request_log._flush

    def watching(client, now):
        seen.append(redis_client().pttl(lock))  # what a flusher killed now leaves behind
        return flush(client, now)

    monkeypatch.setattr(request_log, "_flush", watching)
    record = json.dumps(
        [time.time(), ana.pk, None, None, None, "q", "POST", "/v1/x", 200, None, 1.0, 1, 2, "q", None]
    )
    redis_client().rpush(redis_key(RedisKey.REQUEST_LOG, "all"), record)
    assert flush_request_log(redis_client()) == 1
    assert 0 < seen[0] <= 10_000
    # Left behind by a dead flusher, the lock holds the next flushes back until it lapses.
    redis_client().rpush(redis_key(RedisKey.REQUEST_LOG, "all"), record)
    redis_client().set(lock, "dead-flusher", px=300)
    assert flush_request_log(redis_client()) == 0, "held: left to the flush holding it"
    assert eventually(lambda: flush_request_log(redis_client()) == 1, timeout=3)
    assert RequestLog.objects.count() == 2


def test_a_refused_request_is_logged_with_its_code_channel_and_reason_as_the_caller_got_them(
    gateway_url, world, staff
):
    """An admin reads why bo was turned away: the code, the channel it was for, the reason."""
    book(world, "ana")
    snapshot_seen(gateway_url)
    refused = call(gateway_url + "/channels/ch-a", world.bo_key)
    assert refused.status_code == 403
    told = refused.json()["error"]
    assert call(gateway_url, world.bo_key, model="mistral").status_code == 404
    wait_for_records(2)
    flush_request_log(redis_client())
    row = RequestLog.objects.get(status=403)
    assert (row.error_code, row.channel, row.error) == (told["code"], world.channel, told["message"])
    assert row.error_code == "gpu_reserved" and row.ttft_ms is None  # no token came
    missing = RequestLog.objects.get(status=404)
    assert missing.error_code == "model_not_loaded" and missing.channel is None
    everyone = api_for(staff)
    found = everyone.get("/api/requests/", {"code": "gpu_reserved"}).data
    assert found["count"] == 1 and found["results"][0]["error_code"] == "gpu_reserved"
    assert found["results"][0]["error"] == told["message"] and found["results"][0]["channel"] == "ch-a"
    portal = Client()
    portal.force_login(staff)
    page = portal.get("/requests/", {"code": "gpu_reserved"}).content.decode()
    assert "gpu_reserved" in page and told["message"] in page and "mistral" not in page


def test_a_record_keeps_its_arrival_to_the_microsecond():
    """The moment a request was decided is its arrival plus ``decided_ms``: an arrival rounded
    to the millisecond could put a decision made just before a slot's start inside the slot."""
    import json

    from gateway.rules.callers import Caller
    from gateway.stream.answer import Answer

    answer = Answer()
    answer.caller, answer.status = Caller(1, "ana", 1), 200
    answer.arrived = 1_765_000_000.123_456_7
    arrived = json.loads(answer.record("r-1"))[0]
    assert abs(arrived - 1_765_000_000.123_457) < 1e-6
