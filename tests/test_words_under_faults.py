"""What callers read while a part of the lab is down: each answer names what is really wrong
(docs/gateway.md, the access table)."""

from __future__ import annotations

from datetime import timedelta

import httpx
from django.utils import timezone

from channels_app.models import ChannelRuntime, ChannelTarget, LoadRecord, Node
from gateway.api_keys import api_key_create
from tests import factories
from tests.conftest import serve


def ask(url: str, key: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )


def test_a_channel_on_a_node_whose_worker_never_started_leaves_the_403_naming_the_slot(gateway_url, ana, bo):
    """A second channel was added on a node whose worker never ran, with the default model
    tiny; during ana's slot on demo-0, bo's request for tiny is told about ana's slot at once
    (not 503 "about to load" on a channel nothing will load, which clients retry for 38 s)."""
    tiny = factories.llm("tiny")
    demo = factories.channel("demo-0", on=factories.node("vm"))
    serve(demo, tiny, 9)
    now = timezone.now()
    factories.reservation(owner=ana, on=demo, start=now - timedelta(minutes=5), end=now + timedelta(hours=1))
    never = Node.objects.create(name="gpu2")  # no heartbeat: its worker never reported
    spare = factories.channel("gpu2-0", on=never)
    ChannelTarget.objects.create(channel=spare, model=tiny, reason="default")
    _, bo_key = api_key_create(user=bo, name="t")
    answer = ask(gateway_url, bo_key, "tiny")
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["code"] == "gpu_reserved"
    assert "demo-0 is reserved by someone else" in answer.json()["error"]["message"]
    # Pinned to the stranded channel: it says why, and gives no time to wait for.
    pinned = httpx.post(
        f"{gateway_url}/channels/gpu2-0/v1/chat/completions",
        json={"model": "tiny", "messages": []},
        headers={"Authorization": f"Bearer {bo_key}"},
        timeout=10,
    )
    assert pinned.status_code == 503 and pinned.json()["error"]["code"] == "node_not_ready"
    assert "its node gpu2 is not ready" in pinned.json()["error"]["message"]
    assert "retry-after" not in pinned.headers


def test_a_process_killed_while_serving_is_said_to_start_again_not_to_have_failed_to_load(gateway_url, bo):
    tiny = factories.llm("tiny")
    demo = factories.channel("demo-0", on=factories.node("vm"))
    ChannelTarget.objects.create(channel=demo, model=tiny, reason="default")
    now = timezone.now()
    loaded = LoadRecord.objects.create(
        model=tiny,
        node=demo.node,
        channel=demo,
        started=now - timedelta(minutes=9),
        finished=now,
        succeeded=True,
    )
    ChannelRuntime.objects.create(
        channel=demo,
        phase="failed",
        load=loaded,
        since=now,
        retry_at=now + timedelta(seconds=30),
        error="The process was killed by signal 9.",
    )
    _, bo_key = api_key_create(user=bo, name="t")
    answer = ask(gateway_url, bo_key, "tiny")
    assert answer.status_code == 503, answer.text
    message = answer.json()["error"]["message"]
    assert message.startswith(
        "channel demo-0 stopped unexpectedly while serving tiny and starts it again in "
    )
    assert "failed to load" not in message
