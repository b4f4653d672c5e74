"""The playground (docs/portal.md, "Playground"): chat in the browser with a model one may call
now, through the gateway as the signed-in person, with a key of the sitting's own."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.utils import timezone

from gateway.api_keys import playground_key, tell_keys_expiring
from gateway.models import ApiKey
from reservations.models import Notification
from tests import factories
from tests.clock import eventually
from tests.conftest import snapshot_seen
from tests.factories import client_for
from tests.test_browser import CHROMIUM, browser, shot, sign_in  # noqa: F401  (browser: a fixture)
from tests.test_gateway_server import site_url  # noqa: F401  (a fixture)

needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Chromium (apt-get install chromium)"
)


def test_the_playground_offers_the_models_one_may_call_now_or_says_why_none(world):
    page = client_for(world.ana).get("/playground/").content.decode()
    assert '<option value="llama">llama</option>' in page and '<option value="qwen">qwen</option>' in page
    factories.reservation(
        owner=world.bo,
        on=world.other,
        start=timezone.now() - timedelta(minutes=5),
        end=timezone.now() + timedelta(hours=1),
        target=factories.preset(world.other_model, "b"),
    )
    booked = client_for(world.ana).get("/playground/").content.decode()
    assert '<option value="qwen">' in booked and '<option value="llama">' not in booked  # bo's slot
    world.channel.runtime.delete()
    world.other.runtime.delete()
    none = client_for(world.ana).get("/playground/").content.decode()
    assert "No model to try now: no model is loaded on any channel right now." in none


def test_a_sittings_key_is_the_persons_own_lasts_an_hour_and_is_never_listed_or_told_of(world, frozen):
    client = client_for(world.ana, csrf=True)
    assert client.get("/playground/key").status_code == 405
    assert client.post("/playground/key").status_code == 403  # no CSRF token: not from the page
    page = client_for(world.ana)
    answer = page.post("/playground/key")
    assert answer.status_code == 200 and "no-store" in answer["Cache-Control"]
    made = ApiKey.objects.get(user=world.ana, playground=True)
    assert made.prefix == answer.json()["key"][:10]
    assert made.expires_at == timezone.now() + timedelta(hours=1)
    assert made.prefix not in page.get("/keys/").content.decode()
    # Nobody is told a sitting's key expires, and an expired one goes at the next sitting.
    assert tell_keys_expiring(now=timezone.now() + timedelta(minutes=59)) == 0
    assert not Notification.objects.filter(user=world.ana).exists()
    later = timezone.now() + timedelta(hours=2)
    again, _ = playground_key(user=world.ana, now=later)
    assert list(ApiKey.objects.filter(user=world.ana, playground=True)) == [again]


@pytest.mark.django_db(transaction=True)
@needs_chromium
def test_a_person_chats_with_a_model_in_the_browser_and_a_refusal_is_said_in_the_gateways_words(
    browser,  # noqa: F811
    site_url,  # noqa: F811
    world,
):
    page = sign_in(browser, SimpleNamespace(url=site_url), "ana", width=1366, height=900)
    page.goto(f"{site_url}/playground/")
    page.select_option("#pg-model", "qwen")
    page.fill("#pg-prompt", "Say something")
    page.keyboard.press("Control+Enter")  # sends, as in a chat window
    assert eventually(lambda: page.inner_text("#pg-status").startswith("answered in"), timeout=20)
    answers = page.locator("#pg-log li.chat-assistant .said").all_inner_texts()
    assert len(answers) == 1 and answers[0] not in ("", "…"), answers
    assert page.locator("#pg-log li.chat-user .said").inner_text() == "Say something"
    shot(page, "playground")
    # It went through the gateway to qwen's process.
    assert '"POST /v1/chat/completions' in world.log.read_text()
    # bo books llama's channel now: the gateway refuses ana there, and the page says so.
    factories.reservation(
        owner=world.bo,
        on=world.other,
        start=timezone.now() - timedelta(minutes=1),
        end=timezone.now() + timedelta(hours=1),
        target=factories.preset(world.other_model, "b"),
    )
    snapshot_seen(site_url)
    page.select_option("#pg-model", "llama")
    page.fill("#pg-prompt", "And you?")
    page.click("#pg-send")
    refusal = page.locator("#pg-log li.chat-assistant .said.error")
    assert eventually(lambda: refusal.count() == 1, timeout=20)
    said = refusal.inner_text()
    assert said.startswith("403 gpu_reserved: channel ch-b is reserved by someone else until "), said
    assert page.locator("#pg-log li.chat-user").count() == 2 and not page.locator("#pg-send").is_disabled()
    assert not page.locator("#pg-stop").is_visible()  # nothing runs to stop
