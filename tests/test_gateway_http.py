"""The gateway over real HTTP: a live ASGI server in front of real stand-in processes
(and one real llama-server), with the real Redis counting requests in flight."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, timedelta
from zoneinfo import ZoneInfo

import httpx
import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from channels_app.models import ChannelRuntime
from channels_app.node_worker.gate import publish_gate
from channels_app.node_worker.worker import in_flight
from gateway.admit.step import HOLD_POLL_SECONDS
from gateway.api_keys import api_key_revoke
from gateway.wire.counters import GATE, INFLIGHT, key
from slotserve_base.redis_client import redis_client
from tests import factories
from tests.clock import eventually, throughout
from tests.conftest import free_port, running_llama_server, serve, snapshot_seen

pytestmark = pytest.mark.django_db(transaction=True)


def call(url: str, key: str | None, model: str = "qwen", *, path: str = "/v1/chat/completions", **extra):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url + path, json=body, headers=headers, timeout=30)


def error(answer: httpx.Response) -> tuple[int, str]:
    return answer.status_code, answer.json()["error"]["code"]


def assert_work_cancelled_or_never_begun(log, took: float) -> None:
    """The stand-in's work on a refused request is cancelled; or the request never reached it
    (the fast lane refuses it while its connection to the process is still opening, and the
    connection is closed unused). ``took``: how long the refused call took, its answer included;
    whatever the gateway sent the process before refusing was sent within it."""
    text = log.read_text

    def settled() -> bool:
        return "generating for" not in text() or "generation cancelled" in text()

    # Work that reached the process is cancelled; any still on its way is, too, as it arrives
    # (within as long again as the call took, three times over).
    assert eventually(settled, timeout=5), text()
    assert throughout(lambda: eventually(settled, timeout=1), 3 * took), text()


def timed(make_call: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    """A call's answer, and how long it took to come."""
    started = time.monotonic()
    answer = make_call()
    return answer, time.monotonic() - started


def counted_out(*channels, timeout: float = 5.0) -> None:
    """Until every request on ``channels`` is counted out, with its usage: a count out leaves a
    moment after the answer's end (it rides with the next count in, or goes within 2 ms)."""
    assert eventually(lambda: not any(in_flight(channel.pk) for channel in channels), timeout), (
        "a request is still counted in"
    )


def book(world, who: str, *, exclusive: bool = False):
    """``who`` books channel a from five minutes ago for an hour, with qwen and a preset of
    their own, which channel a runs (as the node worker would have made it by now); or whole-card."""
    now = timezone.now()
    booking = factories.reservation(
        owner=getattr(world, who),
        on=world.channel,
        start=now - timedelta(minutes=5),
        end=now + timedelta(hours=1),
        target=None if exclusive else factories.preset(world.model, f"p{time.monotonic_ns()}"),
    )
    if not exclusive:
        ChannelRuntime.objects.filter(channel=world.channel).update(preset=booking.preset)
    return booking


def test_unreserved_channel_serves_everyone_and_maps_the_model(gateway_url, world):
    for caller in (world.ana_key, world.bo_key):
        answer = call(gateway_url, caller)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "qwen"
    pinned = call(gateway_url + "/channels/ch-b", world.bo_key, model="anything")
    assert pinned.status_code == 200 and pinned.json()["model"] == "llama"


def test_active_reservation_lets_only_the_booker_in(gateway_url, world):
    booking = book(world, "ana")
    snapshot_seen(gateway_url)
    mine = call(gateway_url, world.ana_key, model="whatever-i-like")
    assert mine.status_code == 200 and mine.json()["model"] == "qwen"
    theirs = call(gateway_url, world.bo_key)
    assert error(theirs) == (403, "gpu_reserved")
    assert call(gateway_url + "/channels/ch-a", world.bo_key).status_code == 403
    # The slot's end in bo's own time zone (his profile's), the instant beside it.
    from reservations.profiles import profile_set_time_zone

    profile_set_time_zone(world.bo, "Asia/Tokyo")
    snapshot_seen(gateway_url)
    told = call(gateway_url, world.bo_key).json()["error"]["message"]
    local = timezone.localtime(booking.end, ZoneInfo("Asia/Tokyo"))
    assert f"{local:%H:%M} JST ({booking.end.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ})" in told, told
    # Usage is counted per reservation and per user, and reaches the database with the tick.
    from gateway.usage.flush import flush_usage

    counted_out(world.channel, world.other)
    flush_usage(redis_client())
    booking.refresh_from_db()
    assert (booking.requests, booking.prompt_tokens, booking.completion_tokens) == (1, 5, 8)


def test_booker_waits_while_the_model_loads(gateway_url, world):
    book(world, "ana")
    serve(world.channel, world.model, None, phase="loading")
    snapshot_seen(gateway_url)
    answer = call(gateway_url, world.ana_key)
    assert error(answer) == (503, "model_loading")
    assert int(answer.headers["Retry-After"]) >= 1
    assert error(call(gateway_url, world.bo_key)) == (403, "gpu_reserved")


def test_whole_card_reservation(gateway_url, world):
    book(world, "ana", exclusive=True)
    serve(world.channel, None, None, phase="stopped")
    snapshot_seen(gateway_url)
    answer = call(gateway_url + "/channels/ch-a", world.ana_key)
    assert error(answer) == (503, "gpu_exclusive") and int(answer.headers["Retry-After"]) > 3500
    assert error(call(gateway_url + "/channels/ch-a", world.bo_key)) == (403, "gpu_reserved")


def test_switching_channel_answers_503_for_everyone(gateway_url, world):
    redis_client().set(key(GATE, world.channel.pk), repr(time.time()))  # closed now, as a switch closes it
    for caller in (world.ana_key, world.bo_key):
        answer = call(gateway_url, caller)
        assert error(answer) == (503, "model_switching")
        assert int(answer.headers["Retry-After"]) >= 30
    assert in_flight(world.channel.pk) == 0


def test_a_request_refused_at_the_gate_gets_nothing_of_the_process_and_its_work_is_cancelled(
    gateway_url, world, standins
):
    """The count in runs alongside the request's trip upstream (it costs no wait): when it says
    the gate closed, the client gets 503 at once, none of the process's answer, and the process's
    work on it is cancelled. With a limit to check, nothing goes upstream before the count."""
    port, log = standins("slow", "--standin-prefill-ms", "3000")
    slow = factories.llm("slow")
    channel = factories.channel("ch-slow", on=factories.node("n2"))
    serve(channel, slow, port)
    snapshot_seen(gateway_url)
    redis_client().set(key(GATE, channel.pk), repr(time.time()))
    refused, took = timed(lambda: call(gateway_url, world.bo_key, model="slow"))
    assert error(refused) == (503, "model_switching") and took < 1.5
    assert in_flight(channel.pk) == 0
    assert_work_cancelled_or_never_begun(log, took)
    # Over a limit: refused before anything reaches the process.
    redis_client().delete(key(GATE, channel.pk))
    from gateway.models import ApiKey

    ApiKey.objects.filter(user=world.bo).update(requests_per_minute=1)
    snapshot_seen(gateway_url)
    admitted, took = timed(lambda: call(gateway_url, world.bo_key, model="llama"))
    assert admitted.status_code == 200
    started_work = log.read_text().count("generating for")
    assert error(call(gateway_url, world.bo_key, model="slow")) == (429, "rate_limit_exceeded")
    # Had it gone on, it would have reached the process within a call's whole time.
    assert throughout(lambda: log.read_text().count("generating for") == started_work, 3 * took)


def test_routing_by_model_prefers_the_channel_with_fewer_requests(gateway_url, world, standins):
    port, log_b = standins("qwen")
    serve(world.other, world.model, port)
    redis_client().zadd(key(INFLIGHT, world.channel.pk), {f"r{i}": time.time() + 3600 for i in range(5)})
    snapshot_seen(gateway_url)
    # Both channels run qwen; ch-a has five requests in flight, so ch-b serves.
    answer = call(gateway_url, world.bo_key, stream=False)
    assert answer.status_code == 200
    assert "POST /v1/chat/completions" in log_b.read_text()
    assert "POST /v1/chat/completions" not in world.log.read_text()
    missing = call(gateway_url, world.bo_key, model="mistral")
    assert error(missing) == (404, "model_not_loaded")
    assert "loaded now: qwen on ch-a, qwen on ch-b" in missing.json()["error"]["message"]


def test_models_endpoint_lists_what_the_caller_can_use(gateway_url, world):
    book(world, "ana")
    snapshot_seen(gateway_url)
    mine = httpx.get(gateway_url + "/v1/models", headers={"Authorization": f"Bearer {world.ana_key}"}).json()
    theirs = httpx.get(gateway_url + "/v1/models", headers={"Authorization": f"Bearer {world.bo_key}"}).json()
    assert sorted(m["id"] for m in mine["data"]) == ["llama", "qwen"]
    assert [m["id"] for m in theirs["data"]] == ["llama"]


def test_streaming_passes_chunks_through_and_counts_tokens(gateway_url, world):
    with httpx.stream(
        "POST",
        gateway_url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {world.bo_key}"},
        json={"model": "qwen", "messages": [], "stream": True},
        timeout=30,
    ) as answer:
        assert answer.status_code == 200
        assert answer.headers["x-accel-buffering"] == "no"
        events = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e[6:]) for e in events[:-1]]
    # The usage chunk SlotServe asked for is hidden from a client that did not ask.
    assert len(payloads) == 8 and all(p["choices"] for p in payloads)
    from gateway.usage.flush import flush_usage
    from reservations.models import Profile

    counted_out(world.channel, world.other)
    flush_usage(redis_client())
    assert Profile.objects.get(user=world.bo).completion_tokens == 8


def test_a_large_answer_that_is_not_streamed_comes_whole(gateway_url, world, standins):
    # Past what the gateway buffers from a process before it pauses reading (HIGH_WATER).
    port, _ = standins("qwen", "--standin-chunks", "100000")
    serve(world.channel, world.model, port)
    snapshot_seen(gateway_url)
    for _ in range(2):  # a new connection to the process, then one from the pool
        answer = call(gateway_url, world.ana_key)
        assert answer.status_code == 200
        assert answer.json()["choices"][0]["message"]["content"].split() == [f"t{i}" for i in range(100000)]
        assert answer.json()["usage"]["completion_tokens"] == 100000


def test_bad_requests(gateway_url, world):
    url = gateway_url + "/v1/chat/completions"
    auth = {"Authorization": f"Bearer {world.bo_key}"}
    assert error(httpx.post(url, content=b"{nope", headers=auth)) == (400, "invalid_request")
    assert error(httpx.post(url, content=b"[1, 2]", headers=auth)) == (400, "invalid_request")
    big = httpx.post(url, content=b"{" + b" " * (70 * 1024) + b"}", headers=auth)
    assert error(big) == (413, "request_too_large")
    assert error(call(gateway_url, None)) == (401, "invalid_api_key")
    assert error(call(gateway_url, "ss-not-a-key")) == (401, "invalid_api_key")
    from gateway.models import ApiKey

    api_key_revoke(api_key=ApiKey.objects.get(user=world.bo))
    snapshot_seen(gateway_url)
    assert error(call(gateway_url, world.bo_key)) == (401, "invalid_api_key")


def test_unreachable_upstream_is_502(gateway_url, world):
    serve(world.other, world.other_model, free_port())
    snapshot_seen(gateway_url)
    answer = call(gateway_url, world.ana_key, model="llama")
    assert error(answer) == (502, "upstream_unreachable")
    # Counted out right after the answer went to the client.
    assert eventually(lambda: in_flight(world.other.pk) == 0, timeout=5)
    assert in_flight(world.other.pk) == 0


def test_upstream_dying_mid_stream_ends_with_an_error_event(gateway_url, world, standins):
    port, _ = standins(
        "dying", "--standin-chunks", "200", "--standin-chunk-delay", "20", "--standin-crash-after", "0.5"
    )
    model = factories.llm("dying")
    serve(world.other, model, port)
    snapshot_seen(gateway_url)
    with httpx.stream(
        "POST",
        gateway_url + "/v1/completions",
        headers={"Authorization": f"Bearer {world.ana_key}"},
        json={"model": "dying", "prompt": "x", "stream": True},
        timeout=30,
    ) as answer:
        lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert "upstream_failed" in lines[-1]
    # The gateway counts the request out just after the stream's last bytes leave.
    assert eventually(lambda: in_flight(world.other.pk) == 0, timeout=5)
    assert in_flight(world.other.pk) == 0


def test_client_disconnect_cancels_the_upstream_and_releases_the_count(gateway_url, world, standins):
    port, log = standins("slow", "--standin-chunks", "400", "--standin-chunk-delay", "20")
    model = factories.llm("slow")
    serve(world.other, model, port)
    snapshot_seen(gateway_url)
    counter = world.other.pk
    with httpx.stream(
        "POST",
        gateway_url + "/v1/completions",
        headers={"Authorization": f"Bearer {world.ana_key}"},
        json={"model": "slow", "prompt": "x", "stream": True},
        timeout=30,
    ) as answer:
        lines = answer.iter_lines()
        next(lines)
        assert in_flight(counter) == 1
    assert eventually(lambda: in_flight(counter) == 0, timeout=5)
    assert eventually(lambda: "client went away" in log.read_text(), timeout=5), log.read_text()
    assert "generation cancelled" in log.read_text()


def test_draining_lets_the_stream_finish_and_refuses_new_requests(gateway_url, world, standins):
    """A slow stream is in flight when the target changes: it completes; new requests get 503."""
    from channels_app.models import ChannelTarget
    from channels_app.node_worker import rows, worker
    from slotserve_base.vocabulary import Phase

    port, _ = standins("qwen2", "--standin-chunks", "60", "--standin-chunk-delay", "30")
    model = factories.llm("qwen2")
    runtime = ChannelRuntime.objects.get(channel=world.other)
    serve(world.other, model, port)
    ChannelRuntime.objects.filter(pk=runtime.pk).update(run_id="r", pid=None)
    snapshot_seen(gateway_url)
    received: list[str] = []
    streaming = threading.Event()

    def stream() -> None:
        with httpx.stream(
            "POST",
            gateway_url + "/v1/completions",
            headers={"Authorization": f"Bearer {world.bo_key}"},
            json={"model": "qwen2", "prompt": "x", "stream": True},
            timeout=30,
        ) as answer:
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    received.append(line)
                    streaming.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert streaming.wait(timeout=10)  # the stream is admitted and flowing
    assert in_flight(world.other.pk) == 1
    # The scheduler now wants something else on ch-b; the node worker closes the gate first.
    ChannelTarget.objects.create(channel=world.other, model=world.other_model, reason="manual_override")
    state = rows.state_of(ChannelRuntime.objects.get(channel=world.other))
    publish_gate(
        world.other.pk,
        state,
        rows.wanted_of(world.other, ChannelTarget.objects.get(channel=world.other)),
        timezone.now(),
    )
    assert state.phase == Phase.READY
    refused = call(gateway_url + "/channels/ch-b", world.ana_key, model="qwen2")
    assert error(refused) == (503, "model_switching")
    assert int(worker.in_flight(world.other.pk)) == 1  # the node worker sees the stream and drains
    reader.join(timeout=30)
    assert received[-1] == "data: [DONE]" and len(received) == 61
    # Counted out right after the last bytes went to the client: now the switch can proceed.
    assert eventually(lambda: worker.in_flight(world.other.pk) == 0, timeout=5)
    assert worker.in_flight(world.other.pk) == 0


def test_openai_client_streams_from_a_real_llama_server(gateway_url, world, llama_server_bin, tiny_gguf):
    import openai

    with running_llama_server(llama_server_bin, tiny_gguf, "--alias", "tiny", "-c", "256", "-t", "1") as port:
        tiny = factories.llm("tiny")
        serve(world.other, tiny, port)
        snapshot_seen(gateway_url)
        client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=world.ana_key)
        stream = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Hello"}],
            stream=True,
            max_tokens=8,
            # Greedy and ignoring end-of-text: the random tiny model streams all 8 tokens.
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        chunks = [c for c in stream]
        assert len(chunks) >= 2
        assert any(c.choices and c.choices[0].delta.content for c in chunks)
        assert all(c.model for c in chunks)


def test_metrics_count_answers_phases_loads_and_reservations(gateway_url, world, settings):
    from django.test import Client

    from channels_app.models import LoadRecord

    LoadRecord.objects.create(
        model=world.model,
        node=world.channel.node,
        channel=world.channel,
        started=timezone.now() - timedelta(seconds=42),
        finished=timezone.now(),
        succeeded=True,
    )
    book(world, "ana")
    snapshot_seen(gateway_url)
    assert call(gateway_url, world.ana_key).status_code == 200
    assert call(gateway_url, world.bo_key).status_code == 403
    assert call(gateway_url, None).status_code == 401
    # An answer is counted as it ends, a moment after its last byte reached the client.
    counted = [f'slotserve_gateway_requests_total{{code="{code}"}} 1.0' for code in (200, 403, 401)]
    assert eventually(lambda: all(c in Client().get("/metrics").content.decode() for c in counted), timeout=5)
    text = Client().get("/metrics").content.decode()
    assert "slotserve_gateway_time_to_first_token_seconds_count 1.0" in text
    assert 'slotserve_channel_phase{channel="ch-a",phase="ready"} 1.0' in text
    assert 'slotserve_channel_model_info{channel="ch-b",model="llama",preset=""} 1.0' in text
    assert 'slotserve_gateway_in_flight{channel="ch-a"} 0.0' in text
    assert 'slotserve_loads_total{channel="ch-a",model="qwen",outcome="success"} 1.0' in text
    assert 'slotserve_load_seconds_total{channel="ch-a",model="qwen"} 42' in text
    assert 'slotserve_reservations{status="approved"} 1.0' in text
    settings.SLOTSERVE_METRICS_TOKEN = "scrape-me"
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me").status_code == 200


def test_client_leaving_before_the_first_token_cancels_the_upstream(gateway_url, world, standins):
    """A client that gives up while the model is still reading the prompt (no byte answered yet)
    closes the upstream request at once, streaming or not."""
    port, log = standins("thinker", "--standin-prefill-ms", "5000")
    model = factories.llm("thinker")
    serve(world.other, model, port)
    snapshot_seen(gateway_url)
    counter = world.other.pk
    for streaming in (False, True):
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                gateway_url + "/v1/chat/completions",
                headers={"Authorization": f"Bearer {world.ana_key}"},
                json={"model": "thinker", "messages": [], "stream": streaming},
                timeout=httpx.Timeout(5, read=0.3),
            )
        assert eventually(lambda: in_flight(counter) == 0, timeout=3)

        def all_cancelled(wanted: int = 1 + streaming) -> bool:
            return bool(log.read_text().count("before the first token") >= wanted)

        assert eventually(all_cancelled, timeout=3)
        assert log.read_text().count("before the first token") == 1 + streaming
        assert time.monotonic() - started < 3, "cancelled long before the 5 s prefill would end"


def _ready_later(channel, model, port: int, after: float) -> threading.Thread:
    def flip() -> None:
        time.sleep(after)
        serve(channel, model, port, phase="ready")
        from django.db import connection

        connection.close()

    thread = threading.Thread(target=flip, daemon=True)
    thread.start()
    return thread


def test_a_caller_may_wait_for_the_model_instead_of_a_503(gateway_url, world):
    """llama-swap's behaviour, asked for: held until the model is ready, then answered."""
    port = ChannelRuntime.objects.get(channel=world.channel).port
    serve(world.channel, world.model, port, phase="loading")
    snapshot_seen(gateway_url)
    assert error(call(gateway_url, world.ana_key)) == (503, "model_loading")  # the default stays
    flipping = _ready_later(world.channel, world.model, port, after=0.8)
    started = time.monotonic()
    held = httpx.post(
        f"{gateway_url}/v1/chat/completions",
        json={"model": "qwen", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {world.ana_key}", "X-SlotServe-Wait": "10"},
        timeout=30,
    )
    flipping.join()
    assert held.status_code == 200, held.text
    assert 0.7 < time.monotonic() - started < 5


def test_a_wait_is_bounded_and_a_key_may_wait_by_default(gateway_url, world, ana):
    from gateway.models import ApiKey

    port = ChannelRuntime.objects.get(channel=world.channel).port
    serve(world.channel, world.model, port, phase="loading")
    snapshot_seen(gateway_url)
    started = time.monotonic()
    bounded = httpx.post(
        f"{gateway_url}/v1/chat/completions",
        json={"model": "qwen", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {world.ana_key}", "X-SlotServe-Wait": "1"},
        timeout=30,
    )
    assert error(bounded) == (503, "model_loading") and int(bounded.headers["Retry-After"]) >= 1
    assert 0.9 < time.monotonic() - started < 3
    bad = httpx.post(
        f"{gateway_url}/v1/chat/completions",
        json={"model": "qwen"},
        headers={"Authorization": f"Bearer {world.ana_key}", "X-SlotServe-Wait": "soon"},
    )
    assert error(bad) == (400, "invalid_request") and "X-SlotServe-Wait" in bad.json()["error"]["message"]
    # The key's own default, set through the API.
    client = APIClient()
    client.force_authenticate(ana)
    key_id = ApiKey.objects.get(user=ana).pk
    assert (
        client.patch(f"/api/keys/{key_id}/", {"wait_seconds": 10}, format="json").data["wait_seconds"] == 10
    )
    assert client.patch(f"/api/keys/{key_id}/", {"wait_seconds": 10**6}, format="json").status_code == 400
    snapshot_seen(gateway_url)
    flipping = _ready_later(world.channel, world.model, port, after=0.5)
    assert call(gateway_url, world.ana_key).status_code == 200
    flipping.join()


def _leave_while_held(gateway_url, world, *, after: float) -> None:
    """A request asks to wait for ch-a's loading model and its client leaves ``after`` seconds;
    then the model is ready."""
    port = ChannelRuntime.objects.get(channel=world.channel).port
    serve(world.channel, world.model, port, phase="loading")
    snapshot_seen(gateway_url)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{gateway_url}/v1/chat/completions",
            json={"model": "qwen", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {world.ana_key}", "X-SlotServe-Wait": "30"},
            timeout=after,
        )
    serve(world.channel, world.model, port, phase="ready")


def test_a_client_that_leaves_while_the_gateway_looks_again_is_not_forwarded(gateway_url, world, monkeypatch):
    """The race behind a flaky run: the client leaves while the held request is between two
    waits (reading a fresh view), and the model is ready by the next look. It must not go on."""
    import asyncio

    from gateway.admit.snapshot import SnapshotCache

    real_get = SnapshotCache.get
    looks: list[float] = []

    async def slow_get(self):
        looks.append(time.monotonic())
        if len(looks) > 1:
            await asyncio.sleep(1.5)  # each look after the first is slow: the client leaves meanwhile
        return await real_get(self)

    monkeypatch.setattr(SnapshotCache, "get", slow_get)
    # The second look begins within a hold's poll of the request's arrival (HOLD_POLL_SECONDS),
    # and the client leaves while it lasts, however slowly the machine let the request in.
    _leave_while_held(gateway_url, world, after=1.0)
    assert eventually(lambda: len(looks) >= 2, timeout=5)
    assert_only_the_next_call_arrives(gateway_url, world)
    assert in_flight(world.channel.pk) == 0


def test_a_held_request_whose_client_leaves_never_reaches_the_process(gateway_url, world):
    _leave_while_held(gateway_url, world, after=0.5)
    assert_only_the_next_call_arrives(gateway_url, world)


def assert_only_the_next_call_arrives(gateway_url, world) -> None:
    """A call made after the held request's client left goes through (the model is ready, and
    its looks see it so, slow or not); had the gateway gone on with the held request, it would
    have sent it within one hold's poll of that call, so by then only the call has arrived."""
    # (It waits for the model as the gateway sees it: its view of "ready" may be a moment old.)
    answer, took = timed(
        lambda: httpx.post(
            f"{gateway_url}/v1/chat/completions",
            json={"model": "qwen", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {world.ana_key}", "X-SlotServe-Wait": "10"},
            timeout=30,
        )
    )
    assert answer.status_code == 200, answer.text

    def only_the_call() -> bool:
        return bool(world.log.read_text().count("POST /v1/chat/completions") == 1)

    assert throughout(only_the_call, HOLD_POLL_SECONDS + took), world.log.read_text()


def _chat_in_thread(url: str, key: str, model: str) -> tuple[threading.Thread, list[httpx.Response]]:
    answers: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answers.append(call(url, key, model=model)), daemon=True)
    thread.start()
    return thread, answers


def test_fair_sharing_limits_requests_at_once_atomically(gateway_url, world, standins, settings):
    settings.SLOTSERVE_LIMIT_CONCURRENT_REQUESTS = 1
    port, _ = standins("slow", "--standin-prefill-ms", "1500")
    slow = factories.llm("slow")
    channel = factories.channel("ch-slow", on=factories.node("n2"))
    serve(channel, slow, port)
    snapshot_seen(gateway_url)
    first, answers = _chat_in_thread(gateway_url, world.bo_key, "slow")
    assert eventually(lambda: in_flight(channel.pk) == 1)  # the first is counted in
    second = call(gateway_url, world.bo_key, model="llama")
    assert error(second) == (429, "rate_limit_exceeded"), second.text
    assert second.json()["error"]["type"] == "requests" and second.headers["Retry-After"] == "1"
    assert "1 requests in flight" in second.json()["error"]["message"]
    assert call(gateway_url, world.ana_key, model="llama").status_code == 200  # ana has her own
    first.join()
    assert answers[0].status_code == 200
    assert call(gateway_url, world.bo_key, model="llama").status_code == 200  # the slot is free again
    # Two racing for the last slot: exactly one gets it.
    racers = [_chat_in_thread(gateway_url, world.bo_key, "slow") for _ in range(2)]
    for thread, _ in racers:
        thread.join()
    assert sorted(answers[0].status_code for _, answers in racers) == [200, 429]


def test_a_caller_far_from_its_limits_goes_upstream_while_redis_counts_it_in(
    gateway_url, world, settings, monkeypatch
):
    """Limits cost no wait while the caller has room under them: its first request is checked
    before it goes upstream; the next ones go up while the same check runs in Redis, and are
    counted against the limits all the same."""
    from gateway.wire.counters import Counters
    from slotserve_base.vocabulary import RedisKey

    settings.SLOTSERVE_LIMIT_REQUESTS_PER_MINUTE = 100
    settings.SLOTSERVE_LIMIT_CONCURRENT_REQUESTS = 10
    checked_first = []
    original = Counters.enter

    async def enter(self, channel_id, limits=None, **kwargs):
        checked_first.append(limits is not None)
        return await original(self, channel_id, limits, **kwargs)

    monkeypatch.setattr(Counters, "enter", enter)
    snapshot_seen(gateway_url)
    assert [call(gateway_url, world.bo_key, model="llama").status_code for _ in range(3)] == [200] * 3
    assert checked_first == [True]  # only the first waited for its check
    rate = redis_client().get(key(RedisKey.RATE, f"user-{world.bo.pk}"))
    assert int(rate) == 3  # every request counted against the per-minute limit
    flights = key(RedisKey.USER_FLIGHT, world.bo.pk)
    # Counted out of the user's in-flight set (after the answer).
    assert eventually(lambda: not redis_client().zcard(flights), timeout=2)


def test_a_request_sent_ahead_that_meets_a_limit_is_refused_and_its_work_cancelled(
    gateway_url, world, standins, settings
):
    """Another gateway process took the caller's last requests this minute while this one still
    knew of room: the request that went ahead gets 429 and none of the process's answer, its work
    is cancelled, and the caller's next request is checked before it goes anywhere."""
    from slotserve_base.vocabulary import RedisKey

    settings.SLOTSERVE_LIMIT_REQUESTS_PER_MINUTE = 100
    port, log = standins("slow", "--standin-prefill-ms", "3000")
    slow = factories.llm("slow")
    channel = factories.channel("ch-slow", on=factories.node("n2"))
    serve(channel, slow, port)
    snapshot_seen(gateway_url)
    admitted, admitted_took = timed(lambda: call(gateway_url, world.bo_key, model="llama"))
    assert admitted.status_code == 200  # room: 99 requests
    redis_client().set(key(RedisKey.RATE, f"user-{world.bo.pk}"), 100, ex=60)
    refused, took = timed(lambda: call(gateway_url, world.bo_key, model="slow"))
    assert error(refused) == (429, "rate_limit_exceeded") and took < 1.5
    assert in_flight(channel.pk) == 0
    assert_work_cancelled_or_never_begun(log, took)
    started_work = log.read_text().count("generating for")
    assert error(call(gateway_url, world.bo_key, model="slow")) == (429, "rate_limit_exceeded")
    # Had it gone on, it would have reached the process within a call's whole time.
    assert throughout(lambda: log.read_text().count("generating for") == started_work, 3 * admitted_took)


def test_fair_sharing_per_minute_with_per_user_override_and_the_booker_exempt(gateway_url, world, settings):
    from gateway.models import SharingLimits

    settings.SLOTSERVE_LIMIT_REQUESTS_PER_MINUTE = 2
    snapshot_seen(gateway_url)
    assert [call(gateway_url, world.bo_key, model="llama").status_code for _ in range(3)] == [200, 200, 429]
    refused = call(gateway_url, world.bo_key, model="llama")
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    SharingLimits.objects.create(user=world.bo, requests_per_minute=0)  # bo: no limit
    snapshot_seen(gateway_url)
    assert call(gateway_url, world.bo_key, model="llama").status_code == 200
    # ana in her own slot is not limited there; outside it she is.
    book(world, "ana")
    snapshot_seen(gateway_url)
    assert [call(gateway_url, world.ana_key).status_code for _ in range(4)] == [200] * 4
    assert [call(gateway_url + "/channels/ch-b", world.ana_key, model="x").status_code for _ in range(3)] == [
        200,
        200,
        429,
    ]


def test_fair_sharing_weekly_token_budget(gateway_url, world, settings):
    settings.SLOTSERVE_LIMIT_WEEKLY_TOKENS = 20
    snapshot_seen(gateway_url)
    spent = 0
    for _ in range(10):
        answer = call(gateway_url, world.bo_key, model="llama")
        if answer.status_code != 200:
            break
        usage = answer.json()["usage"]
        spent += usage["prompt_tokens"] + usage["completion_tokens"]
    assert spent >= 20
    assert error(answer) == (429, "insufficient_quota")
    assert answer.json()["error"]["type"] == "insufficient_quota" and "tokens of this week" in answer.text
    assert 0 < int(answer.headers["Retry-After"]) <= 7 * 24 * 3600


def test_a_keys_own_weekly_tokens_hold_it_while_the_persons_other_keys_go_on(gateway_url, world):
    from gateway.api_keys import api_key_create

    _, budgeted = api_key_create(user=world.bo, name="budgeted", weekly_tokens=20)
    snapshot_seen(gateway_url)
    spent = 0
    for _ in range(10):
        answer = call(gateway_url, budgeted, model="llama")
        if answer.status_code != 200:
            break
        usage = answer.json()["usage"]
        spent += usage["prompt_tokens"] + usage["completion_tokens"]
    assert spent >= 20
    assert error(answer) == (429, "insufficient_quota")
    assert "this key used its 20 tokens of this week" in answer.json()["error"]["message"]
    assert call(gateway_url, world.bo_key, model="llama").status_code == 200  # bo's other key


def test_a_keys_own_limit(gateway_url, world, settings):
    from gateway.models import ApiKey

    ApiKey.objects.filter(user=world.bo).update(requests_per_minute=1)
    snapshot_seen(gateway_url)
    assert call(gateway_url, world.bo_key, model="llama").status_code == 200
    refused = call(gateway_url, world.bo_key, model="llama")
    assert error(refused) == (429, "rate_limit_exceeded") and "this key" in refused.json()["error"]["message"]


def test_model_aliases_route_as_their_model(gateway_url, world, staff):
    admin_api = APIClient()
    admin_api.force_authenticate(staff)
    made = admin_api.post("/api/model-aliases/", {"name": "gpt-4o-mini", "model": "qwen"}, format="json")
    assert made.status_code == 201, made.data
    clash = admin_api.post("/api/model-aliases/", {"name": "llama", "model": "qwen"}, format="json")
    assert clash.status_code == 400 and "is the name of a model" in clash.data["message"]
    taken = admin_api.post(
        "/api/models/", {"name": "gpt-4o-mini", "backend": "llama.cpp", "path": "/m.gguf"}, format="json"
    )
    assert taken.status_code == 400 and "is an alias of model qwen" in taken.data["message"]
    user_api = APIClient()
    user_api.force_authenticate(world.bo)
    assert (
        user_api.post("/api/model-aliases/", {"name": "x", "model": "qwen"}, format="json").status_code == 403
    )
    snapshot_seen(gateway_url)
    answer = call(gateway_url, world.bo_key, model="gpt-4o-mini")
    assert answer.status_code == 200 and answer.json()["model"] == "qwen"
    listed = httpx.get(f"{gateway_url}/v1/models", headers={"Authorization": f"Bearer {world.bo_key}"}).json()
    assert {m["id"]: m["aliases"] for m in listed["data"]} == {"qwen": ["gpt-4o-mini"], "llama": []}
    one = httpx.get(
        f"{gateway_url}/v1/models/gpt-4o-mini", headers={"Authorization": f"Bearer {world.bo_key}"}
    )
    assert one.status_code == 200 and one.json()["id"] == "qwen"


def test_a_held_stream_gets_sse_comments_then_the_answer(gateway_url, world, monkeypatch):
    """llama-swap's behaviour for streams: while held, comments keep the connection busy (SSE
    clients skip them); then the answer's events follow in the same stream."""
    import openai

    monkeypatch.setattr("gateway.stream.holding.COMMENT_SECONDS", 0.2)
    port = ChannelRuntime.objects.get(channel=world.channel).port
    serve(world.channel, world.model, port, phase="loading")
    snapshot_seen(gateway_url)
    # The model becomes ready once two comments have come (not at a fixed time: on a loaded
    # machine the request may reach the gateway late).
    lines: list[str] = []
    with httpx.stream(
        "POST",
        f"{gateway_url}/v1/chat/completions",
        json={"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        headers={"Authorization": f"Bearer {world.ana_key}", "X-SlotServe-Wait": "10"},
        timeout=30,
    ) as raw:
        assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
        for line in raw.iter_lines():
            lines.append(line)
            if sum(seen.startswith(": waiting") for seen in lines) == 2 and line.startswith(": waiting"):
                serve(world.channel, world.model, port, phase="ready")
    text = "\n".join(lines)
    assert text.startswith(": waiting for qwen: channel ch-a is loading qwen")
    assert text.count(": waiting") >= 2 and text.rstrip().endswith("data: [DONE]")
    # The SDK reads it as any stream.
    serve(world.channel, world.model, port, phase="loading")
    snapshot_seen(gateway_url)
    flipping = _ready_later(world.channel, world.model, port, after=0.6)
    client = openai.OpenAI(
        base_url=f"{gateway_url}/v1", api_key=world.ana_key, default_headers={"X-SlotServe-Wait": "10"}
    )
    chunks = list(
        client.chat.completions.create(
            model="qwen", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    flipping.join()
    assert any(c.choices and c.choices[0].delta.content for c in chunks)


def test_a_held_stream_that_times_out_ends_with_an_error_event(gateway_url, world, monkeypatch):
    monkeypatch.setattr("gateway.stream.holding.COMMENT_SECONDS", 0.2)
    port = ChannelRuntime.objects.get(channel=world.channel).port
    serve(world.channel, world.model, port, phase="loading")
    snapshot_seen(gateway_url)
    raw = httpx.post(
        f"{gateway_url}/v1/chat/completions",
        json={"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        headers={"Authorization": f"Bearer {world.ana_key}", "X-SlotServe-Wait": "1"},
        timeout=30,
    )
    assert raw.status_code == 200 and raw.text.startswith(": waiting")
    last = [line for line in raw.text.splitlines() if line.startswith("data: ")][-1]
    assert json.loads(last[6:])["error"]["code"] == "model_loading"


def test_a_model_the_decision_names_is_loading_and_a_waiting_caller_is_answered_once_ready(
    gateway_url, world, standins
):
    """Right after the scheduler names a model, before the node worker starts it, the model is
    loading: 503 model_loading with Retry-After, and a caller who asked to wait is held and
    answered when it is ready (it once was 404 model_not_loaded at once)."""
    from channels_app.models import ChannelTarget
    from slotserve_base.vocabulary import Reason

    serve(world.channel, None, None, phase="stopped")
    ChannelTarget.objects.update_or_create(
        channel=world.channel, defaults={"model": world.model, "reason": Reason.DEFAULT}
    )
    snapshot_seen(gateway_url)
    refused = call(gateway_url, world.ana_key)
    assert error(refused) == (503, "model_loading"), refused.text
    assert int(refused.headers["Retry-After"]) >= 1
    answers: list[httpx.Response] = []
    waiting = threading.Thread(
        target=lambda: answers.append(
            httpx.post(
                gateway_url + "/v1/chat/completions",
                json={"model": "qwen", "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {world.ana_key}", "X-SlotServe-Wait": "20"},
                timeout=30,
            )
        ),
        daemon=True,
    )
    waiting.start()
    from slotserve_base.vocabulary import RedisKey

    held = key(RedisKey.HELD, world.ana.pk)
    assert eventually(lambda: redis_client().zcard(held) == 1)  # the gateway holds it
    port, _ = standins("qwen-again", "--standin-chunks", "4")
    serve(world.channel, world.model, port)
    waiting.join(timeout=25)
    assert answers and answers[0].status_code == 200, answers[0].text if answers else "no answer"


def test_at_a_back_to_back_boundary_the_booker_is_not_served_the_last_bookings_model(gateway_url, world):
    """Ana's slot has begun; until the node worker switches, channel a still runs the last
    target (qwen with no preset). She is told it switches, not served it; once her own model
    and preset run she is served."""
    booking = book(world, "ana")
    ChannelRuntime.objects.filter(channel=world.channel).update(preset=None)  # the last target still runs
    snapshot_seen(gateway_url)
    early = call(gateway_url, world.ana_key)
    assert error(early) == (503, "model_switching"), early.text
    assert int(early.headers["Retry-After"]) >= 1
    ChannelRuntime.objects.filter(channel=world.channel).update(preset=booking.preset)
    snapshot_seen(gateway_url)
    assert call(gateway_url, world.ana_key).status_code == 200
