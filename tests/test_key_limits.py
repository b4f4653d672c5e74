"""A key's own limits under its person's (docs/api.md, "Keys scoped like a team's keys"):
requests at once and a minute, set where the key is made; each key's use over the last week,
the request log by key, and a new key tried at once."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from gateway.api_keys import api_key_create
from gateway.models import ApiKey, RequestLog
from tests.clock import eventually
from tests.conftest import snapshot_seen
from tests.factories import client_for
from tests.test_browser import CHROMIUM, browser, sign_in  # noqa: F401  (browser: a fixture)
from tests.test_gateway_http import call, error
from tests.test_gateway_server import site_url  # noqa: F401  (a fixture)


def test_a_key_made_on_the_keys_page_keeps_its_own_limits_and_a_bad_one_is_named(ana):
    page = client_for(ana)
    made = page.post(
        "/keys/",
        {"name": "batch", "max_concurrent": "1", "requests_per_minute": "30", "weekly_tokens": "50000"},
    )
    assert made.status_code == 200 and "Your new key" in made.content.decode()
    key = ApiKey.objects.get(user=ana, name="batch")
    assert (key.max_concurrent, key.requests_per_minute, key.weekly_tokens) == (1, 30, 50000)
    shown = '<td data-label="Own limits" class="limits">1 at once, 30 a minute, 50000 tokens a week</td>'
    assert shown in made.content.decode()
    title = made.content.decode().split("<title>")[1].split("</title>")[0]
    assert title.startswith("API keys") and "<script" not in title
    bad = page.post("/keys/", {"name": "bad", "max_concurrent": "0"}).content.decode()
    assert "Ensure this value is greater than or equal to 1." in bad and not ApiKey.objects.filter(name="bad")


def test_the_rest_api_sets_and_clears_a_keys_limits_and_a_key_makes_none_looser_than_its_own(ana):
    api = APIClient()
    api.force_authenticate(ana)
    made = api.post("/api/keys/", {"name": "ci", "requests_per_minute": 5}, format="json")
    assert made.status_code == 201 and made.data["requests_per_minute"] == 5, made.data
    assert made.data["max_concurrent"] is None
    zero = api.post("/api/keys/", {"name": "zero", "max_concurrent": 0}, format="json")
    assert zero.status_code == 400 and "max_concurrent" in zero.data
    cleared = api.patch(f"/api/keys/{made.data['id']}/", {"requests_per_minute": None}, format="json")
    assert cleared.status_code == 200 and cleared.data["requests_per_minute"] is None
    # Through a key with its own limit, a new key has that limit or a tighter one, never more.
    _, limited = api_key_create(user=ana, name="limited", requests_per_minute=5)
    through = APIClient()
    through.credentials(HTTP_AUTHORIZATION=f"Bearer {limited}")
    inherited = through.post("/api/keys/", {"name": "child"}, format="json")
    assert inherited.status_code == 201 and inherited.data["requests_per_minute"] == 5
    tighter = through.post("/api/keys/", {"name": "tighter", "requests_per_minute": 2}, format="json")
    assert tighter.status_code == 201 and tighter.data["requests_per_minute"] == 2
    looser = through.post("/api/keys/", {"name": "looser", "requests_per_minute": 50}, format="json")
    assert looser.status_code == 403
    assert "more requests a minute than its own 5" in looser.data["message"]
    widened = through.patch(
        f"/api/keys/{inherited.data['id']}/", {"requests_per_minute": None}, format="json"
    )
    assert widened.status_code == 200 and widened.data["requests_per_minute"] == 5  # its own, not none


def test_a_keys_own_limit_holds_at_the_gateway_while_the_persons_other_keys_go_on(gateway_url, world):
    api = APIClient()
    api.force_authenticate(world.ana)
    limited = api.post("/api/keys/", {"name": "one a minute", "requests_per_minute": 1}, format="json").data[
        "key"
    ]
    snapshot_seen(gateway_url)
    assert call(gateway_url, limited).status_code == 200
    assert error(call(gateway_url, limited)) == (429, "rate_limit_exceeded")
    assert call(gateway_url, world.ana_key).status_code == 200  # ana's other key is not held by it


def test_each_keys_use_over_the_week_and_the_request_log_by_key(ana, bo):
    mine, _ = api_key_create(user=ana, name="notebook")
    api_key_create(user=ana, name="quiet")
    theirs, _ = api_key_create(user=bo, name="bo's")
    now = timezone.now()
    for at, key, user in [
        (now - timedelta(hours=1), mine, ana),
        (now - timedelta(days=2), mine, ana),
        (now - timedelta(days=9), mine, ana),  # older than the week
        (now - timedelta(hours=2), theirs, bo),
    ]:
        RequestLog.objects.create(
            at=at,
            user=user,
            key=key,
            path="/v1/chat/completions",
            status=200,
            duration_ms=10,
            prompt_tokens=10,
            completion_tokens=5,
        )
    page = client_for(ana)
    keys = page.get("/keys/").content.decode()
    row = keys[keys.index('<td data-label="Name">notebook') :].split("</tr>")[0]
    assert f'<a href="/requests/?key={mine.pk}">2 requests, 30 tokens</a>' in row
    quiet_row = keys[keys.index('<td data-label="Name">quiet') :].split("</tr>")[0]
    assert '<td data-label="Last 7 days" class="used">none</td>' in quiet_row
    by_id = page.get("/requests/", {"key": mine.pk}).content.decode()
    assert by_id.count("/v1/chat/completions") == 3
    by_prefix = page.get("/requests/", {"key": mine.prefix}).content.decode()
    assert by_prefix.count("/v1/chat/completions") == 3
    assert page.get("/requests/", {"key": theirs.pk}).content.decode().count("/v1/chat/completions") == 0
    api = APIClient()
    api.force_authenticate(ana)
    assert len(api.get("/api/requests/", {"key": mine.prefix}).data["results"]) == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Chromium (apt-get install chromium)")
def test_a_new_key_is_tried_at_once_from_the_keys_page(browser, site_url, world):  # noqa: F811
    page = sign_in(browser, SimpleNamespace(url=site_url), "ana")
    page.goto(f"{site_url}/keys/")
    page.fill("#id_name", "tried")
    page.click("#new-key-form button[type=submit]")
    page.click("#try-key")
    assert eventually(lambda: page.inner_text("#try-result").startswith("It works"), timeout=15)
    assert page.inner_text("#try-result") == "It works: it may call llama, qwen now."
