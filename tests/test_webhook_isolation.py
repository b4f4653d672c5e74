"""Webhook receivers cannot hurt the rest of SlotServe (docs/webhooks.md, "Delivery"): a try has a
deadline on its whole time, reads only an answer's first bytes, deliveries run on a worker of
their own (an override is decided in a second or two while receivers drip and stall), and tests
and redeliveries are limited per webhook."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from reservations.webhooks.models import Delivery, DeliveryState
from reservations.webhooks.services import webhook_create, webhook_test
from slotserve_base.dispatch import WEBHOOK_TEST_SEND
from tests.clock import eventually
from tests.conftest import free_port
from tests.queued import Queued
from tests.receiver import HUNG_UP, Receiver, SlowReceiver
from tests.test_one_command_start import ROOT, _run_env, healthy, log_text, start_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _receivers_on_loopback(settings):
    settings.SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]


def _tried(queued: Queued, webhook_owner, url: str) -> tuple[Delivery, float]:
    """A test event for ``url``, tried once by the webhooks' worker; the delivery and how long
    its try took."""
    webhook = webhook_create(owner=webhook_owner, url=url)
    delivery = webhook_test(webhook=webhook, by=webhook_owner, now=timezone.now())
    began = time.monotonic()
    assert WEBHOOK_TEST_SEND in queued.run()  # (and the webhook's deliverer: nothing else is due)
    took = time.monotonic() - began
    delivery.refresh_from_db()
    return delivery, took


@pytest.mark.parametrize("how", ["drip", "stall"])
def test_a_try_ends_at_its_deadline_however_the_receiver_drips_or_stalls(settings, ana, how, queued):
    settings.SLOTSERVE_WEBHOOK_TIMEOUT_SECONDS = 1.5
    with SlowReceiver(how, every=0.3) as receiver:
        delivery, took = _tried(queued, ana, receiver.url)
        assert receiver.accepted == 1
    assert 1.4 < took < 3.0, took
    assert delivery.state == DeliveryState.FAILED
    assert "no whole answer within 1.5 s (the deadline)" in delivery.attempts.get().error


def test_only_the_first_bytes_of_a_huge_answer_are_read(settings, ana, queued):
    with SlowReceiver("huge", size=200 * 1024 * 1024) as receiver:
        delivery, took = _tried(queued, ana, receiver.url)
        # The sender hung up after the first bytes: the receiver could not write the rest (what
        # it wrote sits in the kernel's buffers, a few MB at most).
        assert receiver.ended.wait(timeout=10) and receiver.ended_by in HUNG_UP, receiver.ended_by
        assert receiver.written < 32 * 1024 * 1024, receiver.written
    assert took < 3.0, took
    kept = delivery.attempts.get()
    assert kept.status_code == 200 and kept.answer == "x" * 500
    assert delivery.state == DeliveryState.DELIVERED


def test_tests_and_redeliveries_are_limited_per_webhook(ana_api, ana, bo_api):
    with Receiver() as receiver:
        made = ana_api.post("/api/webhooks/", {"url": receiver.url}, format="json").json()
        tests = [ana_api.post(f"/api/webhooks/{made['id']}/test") for _ in range(8)]
        assert [t.status_code for t in tests] == [202] * 5 + [429] * 3
        refused = tests[-1]
        assert refused.json()["code"] == "too_many_tries"
        assert "5 tests and redeliveries a minute" in refused.json()["message"]
        assert 1 <= int(refused["Retry-After"]) <= 60
        first = tests[0].json()["id"]
        again = ana_api.post(f"/api/webhooks/{made['id']}/deliveries/{first}/redeliver")
        assert again.status_code == 429, again.content
        assert Delivery.objects.filter(webhook_id=made["id"]).count() == 5
        # Another webhook has its own allowance.
        other = bo_api.post("/api/webhooks/", {"url": receiver.url}, format="json").json()
        assert bo_api.post(f"/api/webhooks/{other['id']}/test").status_code == 202


def _manage(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


SETUP = """
from channels_app.models import Channel, LLMModel, Node, Preset
node = Node.objects.create(name="gpu9")
small = LLMModel.objects.create(name="small", backend="llama.cpp", path="/models/small.gguf", size_bytes=1)
large = LLMModel.objects.create(name="large", backend="llama.cpp", path="/models/large.gguf", size_bytes=1)
for model in (small, large):
    Preset.objects.create(model=model, name="chat")
Channel.objects.create(name="gpu9-0", node=node, gpu_indexes=[0], default_model=small,
                       default_preset=small.presets.get())
"""


def test_receivers_that_drip_and_stall_do_not_delay_an_override(tmp_path):
    """``manage.py run`` with its real Celery workers: two webhooks whose receiver sends a byte
    every second and one whose receiver never answers, each sent test events and a booking's
    news; an admin's override is still decided within a couple of seconds."""
    port = free_port()
    env = {
        **_run_env(tmp_path, port),
        "SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.1",
        "SLOTSERVE_WEBHOOK_TIMEOUT_SECONDS": "30",
    }
    run = start_run(tmp_path, env, "--port", str(port), "--no-node")
    base = f"http://127.0.0.1:{port}"
    try:
        assert healthy(base, time.monotonic() + 90), log_text(tmp_path)[-3000:]
        _manage(env, "shell", "-c", SETUP)
        key = _manage(env, "apikey", "create", "admin").strip()
        api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=10)
        channel = next(c for c in api.get("/api/channels/").json() if c["name"] == "gpu9-0")
        with (
            SlowReceiver("drip", every=1.0) as drip1,
            SlowReceiver("drip", every=1.0) as drip2,
            SlowReceiver("stall") as stall,
        ):
            if True:
                for receiver in (drip1, drip2, stall):
                    made = api.post("/api/webhooks/", json={"url": receiver.url, "scope": "all"})
                    assert made.status_code == 201, made.text
                    for _ in range(5):
                        assert api.post(f"/api/webhooks/{made.json()['id']}/test").status_code == 202
                start = timezone.now().replace(microsecond=0) + timedelta(days=1)
                booked = api.post(
                    "/api/reservations/",
                    json={
                        "channel": "gpu9-0",
                        "model": "small",
                        "start": start.isoformat(),
                        "end": (start + timedelta(hours=1)).isoformat(),
                    },
                )
                assert booked.status_code == 201, booked.text
                assert api.post(f"/api/reservations/{booked.json()['id']}/cancel").status_code == 200
                # Deliveries hold the webhooks' worker's two processes before the override is set.
                assert eventually(
                    lambda: drip1.accepted + drip2.accepted + stall.accepted >= 2, timeout=20, every=0.1
                ), log_text(tmp_path)[-3000:]
                asked = time.monotonic()
                set_ = api.post(
                    f"/api/channels/{channel['id']}/override/",
                    json={
                        "model": "large",
                        "until": (timezone.now() + timedelta(hours=1)).isoformat(),
                    },
                )
                assert set_.status_code == 201, set_.text

                def decided() -> bool:
                    state = api.get(f"/api/channels/{channel['id']}/").json()["state"]
                    return bool(state["target"]) and state["target"]["reason"] == "manual_override"

                assert eventually(decided, timeout=10, every=0.05), log_text(tmp_path)[-3000:]
                took = time.monotonic() - asked
        assert took < 2.5, f"the override was decided {took:.1f} s after it was set"
        assert run.poll() is None, log_text(tmp_path)[-3000:]
    finally:
        os.killpg(run.pid, signal.SIGINT)
        run.wait(timeout=60)


def test_the_one_command_start_runs_deliveries_on_a_worker_of_their_own():
    from slotserve_base.dispatch import webhook_queue
    from slotserve_site.running.parts import scheduler_command, webhooks_command

    scheduler, webhooks = scheduler_command(), webhooks_command()
    assert "--beat" in scheduler and webhook_queue() not in scheduler
    assert webhooks[webhooks.index("--queues") + 1] == webhook_queue() and "--beat" not in webhooks
