"""The gateway's whole surface against the real llama-server and the tiny model: the APIs the
same process answers (Responses, Anthropic Messages, tokenize, props …), routed by model or
pinned to a channel, with answers exactly as the backend sent them (no doubled headers, the
``timings`` kept), in the caller's own error shape, and callable from a browser page on
another origin (CORS)."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.utils import timezone

from channels_app.models import ChannelRuntime
from gateway.api_keys import api_key_create
from tests import factories
from tests.conftest import free_port, running_llama_server, snapshot_seen
from tests.world import World

pytestmark = pytest.mark.django_db(transaction=True)

PAGE_ORIGIN_PORT = free_port()


@pytest.fixture
def tiny_server(llama_server_bin, tiny_gguf) -> Iterator[dict[str, Any]]:
    """The real llama-server with the tiny model, behind its run's secret, as a node starts it."""
    secret = secrets.token_urlsafe(16)
    with running_llama_server(
        llama_server_bin, tiny_gguf, "--alias", "tiny", "-c", "512", "-t", "1", secret=secret
    ) as port:
        yield {"port": port, "secret": secret, "direct": f"http://127.0.0.1:{port}"}


@pytest.fixture
def world(tiny_server, ana, bo) -> World:
    model = factories.llm("tiny")
    channel = factories.channel("cpu-0")
    ChannelRuntime.objects.create(
        channel=channel,
        phase="ready",
        model=model,
        host="127.0.0.1",
        port=tiny_server["port"],
        since=timezone.now(),
        pid=1,
        api_secret=tiny_server["secret"],
    )
    _, ana_key = api_key_create(user=ana, name="t")
    _, bo_key = api_key_create(user=bo, name="t")
    # Built before the gateway starts (``gateway_url``), which reads it first.
    return World(channel=channel, model=model, ana=ana, bo=bo, ana_key=ana_key, bo_key=bo_key)


def book_now(user, world: World, gateway_url: str) -> None:
    """``user`` books the channel for the next hour, with a model (not the whole card)."""
    now = timezone.now()
    booking = factories.reservation(
        owner=user,
        on=world.channel,
        start=now - timedelta(minutes=1),
        end=now + timedelta(hours=1),
        target=factories.preset(world.model, f"p{user.pk}"),
    )
    # The channel runs the booked model and preset, as the node worker would have made it.
    ChannelRuntime.objects.filter(channel=world.channel).update(preset=booking.preset)
    snapshot_seen(gateway_url)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_answers_carry_each_header_once(gateway_url, world):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for stream in (False, True):
        answer = httpx.post(
            f"{gateway_url}/v1/chat/completions",
            json={**body, "stream": stream},
            headers=bearer(world.ana_key),
        )
        assert answer.status_code == 200
        names = [name.lower() for name, _ in answer.headers.multi_items()]
        doubled = sorted({name for name in names if names.count(name) > 1})
        assert doubled == [], f"stream={stream}: {doubled} sent more than once"
        assert "access-control-allow-origin" not in names  # llama-server's own CORS stays behind


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_streams_keep_llama_servers_timings_while_the_gateway_counts_usage(gateway_url, world, tiny_server):
    """The gateway asks for usage to count tokens; llama-server then moves its ``timings`` into
    the usage event the gateway hides. The client still gets them, on the finishing event."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 6,
        "stream": True,
    }
    direct = httpx.post(
        f"{tiny_server['direct']}/v1/chat/completions", json=body, headers=bearer(tiny_server["secret"])
    ).text
    through = httpx.post(f"{gateway_url}/v1/chat/completions", json=body, headers=bearer(world.ana_key)).text
    direct_events, through_events = _events(direct), _events(through)
    assert "timings" in direct_events[-1] and direct_events[-1]["choices"][0]["finish_reason"]
    last = through_events[-1]
    assert last["choices"][0]["finish_reason"] and "timings" in last, through[-600:]
    assert set(last["timings"]) == set(direct_events[-1]["timings"])
    assert all("usage" not in event or event["usage"] is None for event in through_events)
    assert through.rstrip().endswith("data: [DONE]")
    assert all(event["choices"] for event in through_events)  # no usage-only event added


def test_the_responses_api_and_tokenize_are_routed_by_model(gateway_url, world, tiny_server):
    import openai

    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=world.ana_key, max_retries=0)
    response = client.responses.create(model="tiny", input="Hello", max_output_tokens=4)
    assert response.output and response.usage is not None and response.usage.output_tokens > 0
    tokens = httpx.post(
        f"{gateway_url}/tokenize",
        json={"model": "tiny", "content": "hello world"},
        headers=bearer(world.ana_key),
    )
    assert tokens.status_code == 200 and tokens.json()["tokens"]
    direct = httpx.post(
        f"{tiny_server['direct']}/tokenize",
        json={"content": "hello world"},
        headers=bearer(tiny_server["secret"]),
    )
    assert tokens.json() == direct.json()
    nameless = httpx.post(f"{gateway_url}/tokenize", json={"content": "x"}, headers=bearer(world.ana_key))
    assert nameless.status_code == 400 and "names no model" in nameless.json()["error"]["message"]


def test_a_pinned_channel_passes_every_path_through_after_the_access_check(gateway_url, world, ana):
    props = httpx.get(f"{gateway_url}/channels/cpu-0/props", headers=bearer(world.bo_key))
    assert props.status_code == 200 and "default_generation_settings" in props.json()
    tokens = httpx.post(
        f"{gateway_url}/channels/cpu-0/tokenize", json={"content": "hi"}, headers=bearer(world.bo_key)
    )
    back = httpx.post(
        f"{gateway_url}/channels/cpu-0/detokenize",
        json={"tokens": tokens.json()["tokens"]},
        headers=bearer(world.bo_key),
    )
    assert back.status_code == 200 and "hi" in back.json()["content"]
    assert httpx.get(f"{gateway_url}/channels/cpu-0/props").status_code == 401
    book_now(ana, world, gateway_url)
    refused = httpx.get(f"{gateway_url}/channels/cpu-0/props", headers=bearer(world.bo_key))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "gpu_reserved"
    assert httpx.get(f"{gateway_url}/channels/cpu-0/props", headers=bearer(world.ana_key)).status_code == 200


def test_anthropic_clients_use_v1_messages_and_get_anthropic_errors(gateway_url, world, tiny_server, ana):
    import anthropic

    client = anthropic.Anthropic(base_url=gateway_url, api_key=world.ana_key, max_retries=0)
    message = client.messages.create(
        model="tiny", max_tokens=4, messages=[{"role": "user", "content": "Hello"}]
    )
    assert message.content and message.usage.output_tokens > 0
    # Streamed: the same events as llama-server sends (greedy, so the same text both ways; this
    # llama-server build leaves out message_start when the first token is half a character, so
    # the comparison is with its own stream, not with a fixed list).
    ask = {
        "model": "tiny",
        "max_tokens": 4,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Hello"}],
    }
    direct = httpx.post(
        f"{tiny_server['direct']}/v1/messages",
        json={**ask, "stream": True},
        headers=bearer(tiny_server["secret"]),
    )
    direct_types = [line[7:] for line in direct.text.splitlines() if line.startswith("event: ")]
    events = list(
        client.messages.create(
            model="tiny",
            max_tokens=4,
            messages=[{"role": "user", "content": "Hello"}],
            stream=True,
            extra_body={"temperature": 0},
        )
    )
    assert [event.type for event in events] == direct_types
    assert events[-1].type == "message_stop"
    assert next(e for e in events if e.type == "message_delta").usage.output_tokens > 0
    book_now(ana, world, gateway_url)
    other = anthropic.Anthropic(base_url=gateway_url, api_key=world.bo_key, max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        other.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    body = refused.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "permission_error" and "reserved" in body["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gateway_url, api_key="nope", max_retries=0).messages.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
        )


def test_models_one_entry_each_retrieve_and_head(gateway_url, world):
    import openai

    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=world.ana_key, max_retries=0)
    listed = client.models.list().data
    assert [m.id for m in listed] == ["tiny"]
    entry = listed[0].model_dump()
    assert entry["owned_by"] == "slotserve" and entry["created"] > 0 and entry["channels"] == ["cpu-0"]
    assert entry["meta"]["n_ctx"] == 512 and entry["meta"]["n_vocab"] > 0  # llama-server's own
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    head = httpx.head(f"{gateway_url}/v1/models", headers=bearer(world.ana_key))
    got = httpx.get(f"{gateway_url}/v1/models", headers=bearer(world.ana_key))
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == got.headers["content-length"]


@pytest.fixture
def cors(settings):
    settings.SLOTSERVE_CORS_ORIGINS = [f"http://127.0.0.1:{PAGE_ORIGIN_PORT}"]


def test_cors_preflight_before_authentication_and_only_for_allowed_origins(cors, gateway_url, world):
    origin = f"http://127.0.0.1:{PAGE_ORIGIN_PORT}"
    preflight = httpx.options(
        f"{gateway_url}/v1/chat/completions",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == origin
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert preflight.headers["access-control-allow-headers"] == "authorization, content-type"
    answer = httpx.get(f"{gateway_url}/v1/models", headers={**bearer(world.ana_key), "Origin": origin})
    assert answer.headers.get_list("access-control-allow-origin") == [origin]  # ours, once
    stranger = httpx.get(
        f"{gateway_url}/v1/models", headers={**bearer(world.ana_key), "Origin": "http://evil.example"}
    )
    assert "access-control-allow-origin" not in stranger.headers
    refused = httpx.post(
        f"{gateway_url}/v1/chat/completions", json={"model": "tiny"}, headers={"Origin": origin}
    )
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == origin


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Chromium (apt-get install chromium)")
def test_a_page_on_another_origin_streams_from_the_gateway_in_chromium(cors, gateway_url, world):
    import os

    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    page_html = b"""<!doctype html><title>other origin</title><pre id=out></pre><script>
    async function go(base, key) {
      const answer = await fetch(base + "/v1/chat/completions", {method: "POST",
        headers: {"Authorization": "Bearer " + key, "Content-Type": "application/json"},
        body: JSON.stringify({model: "tiny", stream: true, max_tokens: 4,
                              messages: [{role: "user", content: "hi"}]})});
      const text = await answer.text();
      document.getElementById("out").textContent = answer.status + " " + text.includes("[DONE]");
    }
    </script>"""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(page_html)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", PAGE_ORIGIN_PORT), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
            page = browser.new_page()
            errors: list[str] = []
            page.on(
                "console", lambda message: errors.append(message.text) if message.type == "error" else None
            )
            page.goto(f"http://127.0.0.1:{PAGE_ORIGIN_PORT}/")
            page.evaluate(f"go({json.dumps(gateway_url)}, {json.dumps(world.ana_key)})")
            page.wait_for_function("document.getElementById('out').textContent !== ''", timeout=15000)
            assert page.text_content("#out") == "200 true", errors
            browser.close()
    finally:
        server.shutdown()
        server.server_close()


def test_the_async_sdk_streams_twenty_at_once_and_raw_headers_come_once(gateway_url, world):
    import asyncio

    import openai

    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key=world.ana_key, max_retries=0)

        async def one(i: int) -> str:
            stream = await client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": f"count {i}"}],
                stream=True,
                max_tokens=4,
            )
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        try:
            return await asyncio.gather(*(one(i) for i in range(20)))
        finally:
            await client.close()

    texts = asyncio.run(run())
    assert len(texts) == 20 and all(isinstance(t, str) for t in texts)

    raw = openai.OpenAI(
        base_url=f"{gateway_url}/v1", api_key=world.ana_key
    ).chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    names = [name.lower() for name, _ in raw.headers.multi_items()]
    assert len(names) == len(set(names)) and raw.parse().choices


def test_the_sdk_retries_after_the_retry_after_of_a_drain(gateway_url, world, settings):
    """A switching channel answers 503 with a Retry-After the SDK honours; the retry lands after
    the switch. (Drain and stop made short so Retry-After stays under the SDK's 60 s cap.)"""
    import openai

    from slotserve_base.redis_client import redis_client
    from slotserve_base.vocabulary import RedisKey, redis_key

    settings.SLOTSERVE_DRAIN_SECONDS = 0.3
    settings.SLOTSERVE_STOP_TIMEOUT_SECONDS = 0.3
    gate = redis_key(RedisKey.GATE, world.channel.pk)
    redis_client().set(gate, repr(time.time()))  # closed now, as a switch closes it
    snapshot_seen(gateway_url)
    refused = httpx.post(
        f"{gateway_url}/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        headers=bearer(world.ana_key),
    )
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_switching"
    retry_after = int(refused.headers["retry-after"])
    assert 1 <= retry_after <= 3
    threading.Timer(0.8, lambda: redis_client().delete(gate)).start()
    started = time.monotonic()
    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=world.ana_key, max_retries=2)
    answer = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert answer.choices
    assert time.monotonic() - started >= retry_after - 0.1  # it waited as told, not 0.03 s


def test_embeddings_through_an_embeddings_preset(gateway_url, llama_server_bin, tiny_gguf, ana):
    secret = secrets.token_urlsafe(16)
    embedding = ("--alias", "tiny-embed", "-c", "256", "-t", "1", "--embeddings", "--pooling", "mean")
    with running_llama_server(llama_server_bin, tiny_gguf, *embedding, secret=secret) as port:
        channel = factories.channel("embed-0")
        ChannelRuntime.objects.create(
            channel=channel,
            phase="ready",
            model=factories.llm("tiny-embed"),
            host="127.0.0.1",
            port=port,
            since=timezone.now(),
            pid=1,
            api_secret=secret,
        )
        _, key = api_key_create(user=ana, name="e")
        snapshot_seen(gateway_url)
        import openai

        client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=key, max_retries=0)
        vectors = client.embeddings.create(model="tiny-embed", input=["hello", "world"]).data
        assert len(vectors) == 2 and len(vectors[0].embedding) > 0
