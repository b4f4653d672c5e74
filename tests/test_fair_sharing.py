"""Fair sharing under contention (docs/gateway.md): a channel's places, shared by every gateway
process in the real Redis, and its fair queue; then the whole gateway in front of stand-ins and
a real llama-server."""

from __future__ import annotations

import asyncio
import math
import signal
import subprocess
import threading
import time

import httpx
import pytest
from django.conf import settings as django_settings

from channels_app.models import ChannelRuntime
from channels_app.node_worker.worker import in_flight
from gateway.admit.places import Places
from gateway.api_keys import api_key_create
from gateway.wire.counters import Counters
from gateway.wire.queue_scripts import queue_stats
from slotserve_base.redis_client import redis_client
from slotserve_base.vocabulary import RedisKey, redis_key
from tests import factories
from tests.clock import eventually, throughout
from tests.conftest import serve, serving, snapshot_seen

# The channel the Redis-level tests share, as two gateway processes would.
CHANNEL = 7


def two_gateways() -> tuple[Places, Places]:
    return Places(Counters(django_settings.REDIS_URL)), Places(Counters(django_settings.REDIS_URL))


def test_two_gateway_processes_share_one_channels_places_and_serve_its_queue_in_turn():
    async def run() -> None:
        one, two = two_gateways()
        # ana's batch fills both places through gateway one; her third request waits.
        assert (await one.turn(CHANNEL, 2, "a1", 1, 2000)).taken
        assert (await one.turn(CHANNEL, 2, "a2", 1, 2000)).taken
        waiting = await one.turn(CHANNEL, 2, "a3", 1, 2000)
        assert not waiting.taken and waiting.ahead == 0 and waiting.held == 1
        # bo's short request through gateway two waits too, but goes before ana's third.
        bos = await two.turn(CHANNEL, 2, "b1", 2, 16)
        assert not bos.taken and bos.ahead == 0 and bos.held == 2
        assert (await one.turn(CHANNEL, 2, "a3", 1, 2000)).ahead == 1
        # One of ana's requests ends: the freed place is bo's, not ana's next.
        await asyncio.sleep(0.05)
        await one.leave(CHANNEL, "a1", 1)
        assert not (await one.turn(CHANNEL, 2, "a3", 1, 2000)).taken
        assert (await two.turn(CHANNEL, 2, "b1", 2, 16)).taken
        await one.leave(CHANNEL, "a2", 1)
        assert (await one.turn(CHANNEL, 2, "a3", 1, 2000)).taken
        held, taken, waited = queue_stats(redis_client(), [CHANNEL])[CHANNEL]
        assert (held, taken) == (0, 4) and waited >= 0.1  # four places taken, two after a wait
        one.counters.close()
        two.counters.close()

    asyncio.run(run())


def test_one_user_alone_fills_every_place():
    async def run() -> None:
        one, _ = two_gateways()
        turns = [await one.turn(CHANNEL, 3, f"a{n}", 1, 100) for n in range(4)]
        assert [t.taken for t in turns] == [True, True, True, False]
        one.counters.close()

    asyncio.run(run())


def test_the_queues_bounds_answer_with_a_retry_after_from_the_drain_rate(settings):
    settings.SLOTSERVE_QUEUE_PER_USER = 2
    settings.SLOTSERVE_QUEUE_PER_CHANNEL = 3

    async def run() -> None:
        one, _ = two_gateways()
        assert (await one.turn(CHANNEL, 1, "a0", 1, 100)).taken
        for n in (1, 2):
            assert not (await one.turn(CHANNEL, 1, f"a{n}", 1, 100)).taken
        # One request taken in the last second: a turn a second at least. ana's first waiting
        # request is next: one turn to wait.
        mine = await one.turn(CHANNEL, 1, "a3", 1, 100)
        assert (mine.full, mine.retry_after) == ("user", 1)
        assert not (await one.turn(CHANNEL, 1, "b1", 2, 100)).taken
        # The queue is full: a try succeeds once one of them is taken.
        theirs = await one.turn(CHANNEL, 1, "c1", 3, 100)
        assert (theirs.full, theirs.retry_after) == ("channel", 1)
        # Refused requests were never held: the queue holds the three it took.
        assert queue_stats(redis_client(), [CHANNEL])[CHANNEL][0] == 3
        one.counters.close()

    asyncio.run(run())


def test_a_closed_gate_sends_held_requests_away_and_a_turn_not_looked_after_expires(monkeypatch):
    monkeypatch.setattr("gateway.admit.places.HELD_SECONDS", 0.3)

    async def run() -> None:
        one, _ = two_gateways()
        assert (await one.turn(CHANNEL, 1, "a0", 1, 100)).taken
        gone_looked = time.monotonic()
        assert not (await one.turn(CHANNEL, 1, "gone", 2, 100)).taken  # its gateway then dies
        assert not (await one.turn(CHANNEL, 1, "b1", 3, 100)).taken
        assert (await one.turn(CHANNEL, 1, "b1", 3, 100)).ahead == 1  # "gone" waits before it
        # b1's gateway keeps looking after its turn, gone's does not: gone's expires, and only
        # then, HELD_SECONDS (0.3 s) after its last look.
        while (await one.turn(CHANNEL, 1, "b1", 3, 100)).ahead != 0:
            assert time.monotonic() - gone_looked < 5, "a turn nobody looked after did not expire"
            await asyncio.sleep(0.02)
        assert time.monotonic() - gone_looked >= 0.3
        redis_client().set(redis_key(RedisKey.GATE, CHANNEL), "1")
        assert (await one.turn(CHANNEL, 1, "b1", 3, 100)).switching
        redis_client().delete(redis_key(RedisKey.GATE, CHANNEL))
        assert queue_stats(redis_client(), [CHANNEL])[CHANNEL][0] == 0
        one.counters.close()

    asyncio.run(run())


# Through the gateway, in front of stand-ins: a slow one streams for about a second.
SLOW = ("--standin-chunks", "40", "--standin-chunk-delay", "25")
# 5 s an answer: for a test that reads a state while the answers run.
LONG = ("--standin-chunks", "200", "--standin-chunk-delay", "25")


class Stream(threading.Thread):
    """A streamed chat request in a thread: when its first data and its end arrived."""

    def __init__(
        self, url: str, key: str, model: str, *, path: str = "/v1/chat/completions", **extra
    ) -> None:
        super().__init__(daemon=True)
        self.url, self.key, self.model, self.path, self.extra = url, key, model, path, extra
        self.status: int | None = None
        # Monotonic times of the first data line and of the end (NaN, which no comparison
        # holds, until they come).
        self.first = self.ended = math.nan
        self.start()

    def run(self) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        with httpx.stream(
            "POST",
            self.url + self.path,
            json={**body, **self.extra},
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=60,
        ) as answer:
            self.status = answer.status_code
            for line in answer.iter_lines():
                if line.startswith("data:") and math.isnan(self.first):
                    self.first = time.monotonic()
        self.ended = time.monotonic()


def busy_channel(world, standins, places: int, *options: str):
    """Channel b serves a slow stand-in with ``places`` places, as its node worker found them."""
    port, log = standins("slow", *(options or SLOW))
    model = factories.llm("slow")
    serve(world.other, model, port)
    ChannelRuntime.objects.filter(channel=world.other).update(places=places)
    return log


def waiting_on(channel) -> int:
    return queue_stats(redis_client(), [channel.pk])[channel.pk][0]


def test_a_colleagues_request_takes_the_next_place_not_the_end_of_a_batch(gateway_url, world, standins):
    busy_channel(world, standins, 1)
    snapshot_seen(gateway_url)
    batch = [Stream(gateway_url, world.ana_key, "slow", max_tokens=2000)]
    assert eventually(lambda: in_flight(world.other.pk) == 1)
    batch += [Stream(gateway_url, world.ana_key, "slow", max_tokens=2000) for _ in range(3)]
    assert eventually(lambda: waiting_on(world.other) == 3)
    colleague = Stream(gateway_url, world.bo_key, "slow", max_tokens=16)
    for stream in [*batch, colleague]:
        stream.join(timeout=30)
    assert [s.status for s in batch] + [colleague.status] == [200] * 5
    # bo's request arrived after ana's three waiting ones and went at the first freed place.
    assert colleague.first < min(s.first for s in batch[1:])
    # The place was never shared: each of ana's waiting requests began after the one before ended.
    starts = sorted(s.first for s in batch[1:])
    assert starts[0] > batch[0].ended - 0.05


def test_a_request_whose_client_leaves_while_it_waits_its_turn_never_reaches_the_process(
    gateway_url, world, standins
):
    log = busy_channel(world, standins, 1)
    snapshot_seen(gateway_url)
    started = time.monotonic()
    first = Stream(gateway_url, world.ana_key, "slow")
    assert eventually(lambda: in_flight(world.other.pk) == 1)
    went_on = time.monotonic() - started  # how long a request takes to be let through
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            gateway_url + "/v1/chat/completions",
            json={"model": "slow", "messages": [], "stream": True},
            headers={"Authorization": f"Bearer {world.bo_key}"},
            timeout=httpx.Timeout(5, read=0.5),
        )
    assert eventually(lambda: waiting_on(world.other) == 0, timeout=3)  # it left the queue
    first.join(timeout=30)
    assert first.status == 200
    # Had the gateway let it through after its client left, it would have reached the process
    # within as long as the first took to go on, three times over.
    assert throughout(lambda: log.read_text().count("generating for") == 1, 3 * went_on), log.read_text()


def test_retry_after_comes_from_the_recent_drain_and_the_callers_own_place(settings):
    """A burst after a quiet minute: forty requests taken in the last two seconds, one 55 s
    before. The drain is the burst's, not the minute's average, and a caller at their limit
    waits for their own first request's turn, not for the whole queue."""
    settings.SLOTSERVE_QUEUE_PER_USER = 2
    settings.SLOTSERVE_QUEUE_PER_CHANNEL = 50

    async def run() -> None:
        one, _ = two_gateways()
        assert (await one.turn(CHANNEL, 1, "x0", 9, 100)).taken
        for user in range(3, 8):
            assert not (await one.turn(CHANNEL, 1, f"u{user}", user, 100)).taken
        for n in (1, 2):  # ana's, behind the other five (her cost puts them last)
            assert (await one.turn(CHANNEL, 1, f"a{n}", 1, 1000)).ahead == 4 + n
        client = redis_client()
        now = float(client.time()[0]) + client.time()[1] / 1e6
        served = redis_key(RedisKey.QUEUE_SERVED, CHANNEL)
        client.delete(served)
        client.zadd(served, {"long-ago": now - 55, **{f"r{i}": now - 2 + i * 0.05 for i in range(40)}})
        mine = await one.turn(CHANNEL, 1, "a3", 1, 1000)
        # Six turns ahead of ana's first (five, and hers) at twenty a second: under a second.
        assert (mine.full, mine.retry_after) == ("user", 1)
        one.counters.close()

    asyncio.run(run())


def test_past_its_bounds_the_queue_answers_429_or_503_with_retry_after(
    gateway_url, world, standins, settings
):
    settings.SLOTSERVE_QUEUE_PER_USER = 1
    settings.SLOTSERVE_QUEUE_PER_CHANNEL = 2
    # Answers of 5 s: the place stays taken, and the queue full, while the test asks, however
    # loaded the machine (1 s was not, under a full CI run).
    busy_channel(world, standins, 1, *LONG)
    _, third = api_key_create(user=factories.user("cy"), name="t")
    snapshot_seen(gateway_url)
    streams = [Stream(gateway_url, world.ana_key, "slow")]
    assert eventually(lambda: in_flight(world.other.pk) == 1)
    streams.append(Stream(gateway_url, world.ana_key, "slow"))
    assert eventually(lambda: waiting_on(world.other) == 1)
    headers = {"Authorization": f"Bearer {world.ana_key}"}
    body = {"model": "slow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    mine = httpx.post(gateway_url + "/v1/chat/completions", json=body, headers=headers, timeout=10)
    assert mine.status_code == 429 and mine.json()["error"]["code"] == "queue_full", mine.text
    assert int(mine.headers["Retry-After"]) >= 1
    streams.append(Stream(gateway_url, world.bo_key, "slow"))
    assert eventually(lambda: waiting_on(world.other) == 2)
    # The channel's queue is full: the third colleague is told so in their own API's shape.
    theirs = httpx.post(
        gateway_url + "/v1/messages",
        json={**body, "max_tokens": 8},
        headers={"x-api-key": third, "anthropic-version": "2023-06-01"},
        timeout=10,
    )
    assert theirs.status_code == 503 and theirs.json()["type"] == "error", theirs.text
    assert "is busy" in theirs.json()["error"]["message"] and int(theirs.headers["Retry-After"]) >= 1
    for stream in streams:
        stream.join(timeout=30)
    assert [s.status for s in streams] == [200, 200, 200]


def test_the_booker_in_their_slot_is_never_queued(gateway_url, world, standins):
    from tests.test_gateway_http import book

    ChannelRuntime.objects.filter(channel=world.channel).update(places=1)
    port, _ = standins("qwen", *SLOW)
    ChannelRuntime.objects.filter(channel=world.channel).update(port=port)
    book(world, "ana")
    snapshot_seen(gateway_url)
    streams = [Stream(gateway_url, world.ana_key, "qwen") for _ in range(2)]
    for stream in streams:
        stream.join(timeout=30)
    assert [s.status for s in streams] == [200, 200]
    # Both streamed side by side: the second began long before the first ended.
    assert max(s.first for s in streams) < min(s.ended for s in streams) - 0.3
    assert waiting_on(world.channel) == 0


def test_a_request_whose_turn_comes_after_someone_elses_slot_began_is_refused(gateway_url, world, standins):
    """bo waits his turn on channel b while ana's stream holds its one place; ana's booking of
    the channel begins meanwhile. When the place is freed it is not bo's: the channel is
    ana's alone now (403 gpu_reserved), however long he had waited."""
    from datetime import timedelta

    from django.utils import timezone

    busy_channel(world, standins, 1, "--standin-chunks", "320", "--standin-chunk-delay", "25")  # 8 s
    from channels_app.models import LLMModel

    preset = factories.preset(LLMModel.objects.get(name="slow"), "mine")
    ChannelRuntime.objects.filter(channel=world.other).update(preset=preset)
    begins = timezone.now() + timedelta(seconds=5)  # after both requests are in, before ana's ends
    factories.reservation(
        owner=world.ana, on=world.other, start=begins, end=begins + timedelta(hours=1), target=preset
    )
    snapshot_seen(gateway_url)
    first = Stream(gateway_url, world.ana_key, "slow")
    assert eventually(lambda: in_flight(world.other.pk) == 1)
    answers: list[httpx.Response] = []
    asked = {"model": "slow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    waiting = threading.Thread(  # not streamed: no comment while it waits, its status is the answer's
        target=lambda: answers.append(
            httpx.post(
                gateway_url + "/v1/chat/completions",
                json=asked,
                headers={"Authorization": f"Bearer {world.bo_key}"},
                timeout=60,
            )
        )
    )
    waiting.start()
    assert eventually(lambda: waiting_on(world.other) == 1)
    first.join(timeout=30)
    waiting.join(timeout=30)
    assert timezone.now() > begins  # the slot began while he waited
    [answer] = answers
    assert (first.status, answer.status_code) == (200, 403), answer.text
    assert answer.json()["error"]["code"] == "gpu_reserved"


def test_two_gateway_processes_share_a_channels_places(gateway_url, world, standins):
    from gateway.serve.proxy import Gateway

    busy_channel(world, standins, 1)
    snapshot_seen(gateway_url)
    with serving(Gateway()) as other_url:
        first = Stream(gateway_url, world.ana_key, "slow")
        assert eventually(lambda: in_flight(world.other.pk) == 1)
        second = Stream(other_url, world.bo_key, "slow")
        assert eventually(lambda: waiting_on(world.other) == 1)
        first.join(timeout=30)
        second.join(timeout=30)
    assert (first.status, second.status) == (200, 200)
    assert second.first > first.ended - 0.05  # it waited for the one place, across processes


@pytest.mark.django_db
def test_a_groups_share_weight_is_its_members_weight_in_the_queue(ana, bo):
    from django.contrib.auth.models import Group

    from gateway.admit.snapshot import read_snapshot
    from reservations.models import GroupPolicy

    for name, weight in (("vision", 3), ("speech", 2)):
        group = Group.objects.create(name=name)
        GroupPolicy.objects.create(group=group, share_weight=weight)
        ana.groups.add(group)
    for user in (ana, bo):
        api_key_create(user=user, name="t")
    weights = {caller.username: caller.weight for caller in read_snapshot().callers.values()}
    assert weights == {"ana": 3, "bo": 1}  # a member of several groups has the largest


def test_the_queue_is_seen_in_metrics_on_the_overview_and_in_the_request_log(gateway_url, world, standins):
    from django.test import Client

    from gateway.models import RequestLog
    from gateway.usage.request_log import flush_request_log

    # Answers of 5 s: the place stays taken and bo waiting while the test reads the metrics and
    # the overview, however loaded the machine.
    busy_channel(world, standins, 1, *LONG)
    snapshot_seen(gateway_url)
    first = Stream(gateway_url, world.ana_key, "slow")
    assert eventually(lambda: in_flight(world.other.pk) == 1)
    second = Stream(gateway_url, world.bo_key, "slow")
    assert eventually(lambda: waiting_on(world.other) == 1)
    text = Client().get("/metrics").content.decode()
    assert 'slotserve_channel_places{channel="ch-b"} 1.0' in text
    assert 'slotserve_channel_queue_waiting{channel="ch-b"} 1.0' in text
    viewer = Client()
    viewer.force_login(world.bo)
    page = viewer.get("/").content.decode()
    assert "1 of 1 places in use · 1 waiting" in page
    first.join(timeout=30)
    second.join(timeout=30)
    text = Client().get("/metrics").content.decode()
    assert 'slotserve_channel_queue_placed_total{channel="ch-b"} 2.0' in text
    assert eventually(lambda: flush_request_log(redis_client()) == 0 and RequestLog.objects.count() == 2)
    queued = dict(RequestLog.objects.values_list("user__username", "queued_ms"))
    assert queued["ana"] is None  # a free place: no wait
    assert queued["bo"] is not None and queued["bo"] > 300  # it waited for ana's stream (about 5 s)
    # Each was decided when it went: ana's at once, bo's when his turn came, not at his arrival.
    ana, bo = (RequestLog.objects.get(user__username=name).decided_ms or 0.0 for name in ("ana", "bo"))
    # bo's after his wait (two clocks: within 10 ms); ana's at once, or after a snapshot read
    assert bo > queued["bo"] - 10 and ana < bo - 300, (ana, bo)


@pytest.mark.django_db
def test_a_presets_places_are_set_through_the_api_and_checked(staff_api):
    factories.llm("qwen")
    refused = staff_api.post("/api/presets/", {"model": "qwen", "name": "chat", "places": 0}, format="json")
    assert refused.status_code == 400 and "places" in refused.json()
    made = staff_api.post("/api/presets/", {"model": "qwen", "name": "chat", "places": 4}, format="json")
    assert made.status_code == 201 and made.json()["places"] == 4
    cleared = staff_api.patch(f"/api/presets/{made.json()['id']}/", {"places": None}, format="json")
    assert cleared.status_code == 200 and cleared.json()["places"] is None


def test_a_look_at_the_process_never_waits_for_a_place(gateway_url, world, standins):
    busy_channel(world, standins, 1)
    snapshot_seen(gateway_url)
    first = Stream(gateway_url, world.ana_key, "slow")
    assert eventually(lambda: in_flight(world.other.pk) == 1)
    started = time.monotonic()
    look = httpx.get(
        gateway_url + "/channels/ch-b/health", headers={"Authorization": f"Bearer {world.bo_key}"}, timeout=10
    )
    assert look.status_code == 200 and time.monotonic() - started < 0.5  # not after ana's stream
    assert math.isnan(first.ended)
    first.join(timeout=30)


def test_under_a_flood_on_a_real_llama_server_a_colleague_goes_before_the_batch(
    gateway_url, world, llama_server_bin, tiny_gguf
):
    """ana keeps ten long streams going on a real llama-server with two slots; bo's short request
    takes the next slot that frees, before the rest of ana's batch. The server is paused while bo
    joins the queue, so what is waiting when he does is known exactly."""
    from tests.conftest import free_port, healthy

    port = free_port()
    llama = subprocess.Popen(
        [
            llama_server_bin,
            "-m",
            str(tiny_gguf),
            "--port",
            str(port),
            "-np",
            "2",
            "-c",
            "1024",
            "--alias",
            "tiny",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert eventually(lambda: healthy(port), timeout=30)
        tiny = factories.llm("tiny")
        serve(world.other, tiny, port)
        ChannelRuntime.objects.filter(channel=world.other).update(places=2)
        snapshot_seen(gateway_url)
        long = {"max_tokens": 480, "ignore_eos": True}
        llama.send_signal(signal.SIGSTOP)
        batch = [Stream(gateway_url, world.ana_key, "tiny", **long) for _ in range(10)]
        assert eventually(lambda: waiting_on(world.other) == 8)
        colleague = Stream(gateway_url, world.bo_key, "tiny", max_tokens=8)
        assert eventually(lambda: waiting_on(world.other) == 9)
        llama.send_signal(signal.SIGCONT)
        for stream in [*batch, colleague]:
            stream.join(timeout=60)
        assert [s.status for s in [*batch, colleague]] == [200] * 11
        # Of ana's eight waiting requests, at most one (taking the other place freed at the same
        # moment) began before bo's; first come first served would have begun all eight.
        assert sum(s.first < colleague.first for s in batch) <= 3, sorted(s.first for s in batch)
    finally:
        llama.send_signal(signal.SIGCONT)
        llama.terminate()
        llama.wait()
