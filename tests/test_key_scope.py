"""API keys scoped like a team's keys (docs/api.md): limited to models and channels, expiring, or
read-only; through the gateway (both lanes), the REST API, the keys page and the owner's notice."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from gateway.api_keys import api_key_change, api_key_create, tell_keys_expiring
from gateway.models import ApiKey
from reservations.models import Notification
from tests import factories
from tests.conftest import snapshot_seen
from tests.test_gateway_http import book, call, error

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_key_limited_to_a_model_and_a_channel_is_refused_outside_them_naming_its_scope(gateway_url, world):
    _, only_qwen = api_key_create(user=world.ana, name="qwen only", models=[world.model])
    _, only_b = api_key_create(user=world.ana, name="b only", channels=[world.other])
    snapshot_seen(gateway_url)
    assert call(gateway_url, only_qwen).status_code == 200
    other = call(gateway_url, only_qwen, model="llama")
    assert error(other) == (403, "key_scope") and "models qwen" in other.json()["error"]["message"]
    listed = httpx.get(gateway_url + "/v1/models", headers={"Authorization": f"Bearer {only_qwen}"}).json()
    assert [m["id"] for m in listed["data"]] == ["qwen"]
    assert call(gateway_url, only_b, model="llama").status_code == 200
    pinned = call(gateway_url + "/channels/ch-a", only_b)
    assert error(pinned) == (403, "key_scope") and "channel ch-a" in pinned.json()["error"]["message"]
    assert pinned.json()["error"]["message"].endswith("it is limited to channel ch-b")  # named, not counted
    # The same user's unscoped key reaches everything.
    assert call(gateway_url, world.ana_key, model="llama").status_code == 200


def test_an_expired_key_is_told_it_expired_at_the_gateway_and_the_api(gateway_url, world):
    soon, key = api_key_create(user=world.ana, name="soon", expires_at=timezone.now() + timedelta(hours=1))
    snapshot_seen(gateway_url)
    assert call(gateway_url, key).status_code == 200
    ApiKey.objects.filter(pk=soon.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    snapshot_seen(gateway_url)
    refused = call(gateway_url, key)
    assert error(refused) == (401, "key_expired") and "expired on" in refused.json()["error"]["message"]
    api = APIClient()
    answer = api.get("/api/reservations/", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert answer.status_code == 401 and "expired" in answer.json()["message"]


def test_a_read_only_key_reads_the_api_and_cannot_book(ana):
    channel = factories.channel("a100-0")
    _, key = api_key_create(user=ana, name="dashboard", read_only=True)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert api.get("/api/reservations/").status_code == 200
    start = timezone.now() + timedelta(days=1)
    refused = api.post(
        "/api/reservations/",
        {"channel": channel.pk, "start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()},
        format="json",
    )
    assert refused.status_code == 403 and "read-only" in refused.json()["message"]


def test_keys_are_scoped_through_the_api_and_a_past_expiry_is_refused(ana):
    qwen = factories.llm("qwen")
    channel = factories.channel("a100-0")
    api = APIClient()
    api.force_authenticate(ana)
    later = (timezone.now() + timedelta(days=30)).replace(microsecond=0)
    made = api.post(
        "/api/keys/",
        {
            "name": "ci",
            "models": ["qwen"],
            "channels": ["a100-0"],
            "expires_at": later.isoformat(),
            "read_only": True,
        },
        format="json",
    )
    assert made.status_code == 201, made.json()
    body = made.json()
    assert (body["models"], body["channels"], body["read_only"]) == (["qwen"], ["a100-0"], True)
    stored = ApiKey.objects.get(pk=body["id"])
    assert list(stored.models_allowed.all()) == [qwen] and list(stored.channels_allowed.all()) == [channel]
    opened = api.patch(f"/api/keys/{body['id']}/", {"models": [], "expires_at": None}, format="json")
    assert opened.status_code == 200 and opened.json()["models"] == [] and opened.json()["expires_at"] is None
    past = api.post("/api/keys/", {"name": "old", "expires_at": "2020-01-01T00:00:00Z"}, format="json")
    assert past.status_code == 400 and "expires_at" in str(past.json())
    assert not ApiKey.objects.filter(name="old").exists()


def test_the_keys_page_makes_a_scoped_key_and_shows_its_scope(ana):
    qwen = factories.llm("qwen")
    client = Client()
    client.force_login(ana)
    last_day = (timezone.localdate() + timedelta(days=10)).isoformat()
    page = client.post(
        "/keys/",
        {"name": "notebook", "wait_seconds": 0, "models": [qwen.pk], "expires": last_day, "read_only": "on"},
    ).content.decode()
    made = ApiKey.objects.get(name="notebook")
    assert list(made.models_allowed.all()) == [qwen] and made.read_only and made.expires_at is not None
    assert "models qwen" in page and "read-only" in page and "last day it works" in page
    assert "it still calls models through the gateway" in page  # said where it is made


def test_a_key_made_to_last_days_is_told_when_half_its_life_is_left_not_at_once(ana):
    """A five-day key made now is no news today: its owner hears of it two and a half days
    before it stops, as one made long ago hears a week before."""
    now = timezone.now()
    api_key_create(user=ana, name="five days", expires_at=now + timedelta(days=5))
    assert tell_keys_expiring(now=now + timedelta(minutes=2)) == 0
    assert tell_keys_expiring(now=now + timedelta(days=2)) == 0
    assert tell_keys_expiring(now=now + timedelta(days=2, hours=13)) == 1


def test_an_owner_is_told_once_a_week_before_their_key_stops_working(ana):
    now = timezone.now()
    soon, _ = api_key_create(user=ana, name="soon", expires_at=now + timedelta(days=3))
    api_key_create(user=ana, name="later", expires_at=now + timedelta(days=10))
    api_key_create(user=ana, name="forever")
    ApiKey.objects.update(created=now - timedelta(days=60))  # made long ago
    assert tell_keys_expiring(now=now) == 1
    assert tell_keys_expiring(now=now + timedelta(hours=1)) == 0  # once
    told = Notification.objects.get(user=ana, event="key_expiring")
    assert "soon" in told.text and told.link == "/keys/"
    # A new expiry is told anew.
    api_key_change(api_key=soon, expires_at=now + timedelta(days=5), now=now)
    assert tell_keys_expiring(now=now) == 1


def test_a_new_expiry_set_in_the_admin_is_told_anew(ana):
    root = factories.user("root", staff=True, is_superuser=True)
    now = timezone.now()
    key, _ = api_key_create(user=ana, name="soon", expires_at=now + timedelta(days=3))
    ApiKey.objects.filter(pk=key.pk).update(created=now - timedelta(days=60))
    assert tell_keys_expiring(now=now) == 1
    admin = Client()
    admin.force_login(root)
    page = admin.get(f"/admin/gateway/apikey/{key.pk}/change/")
    later = timezone.localtime(now + timedelta(days=5))
    form = {
        "user": ana.pk,
        "name": "soon",
        "wait_seconds": 0,
        "expires_at_0": f"{later:%Y-%m-%d}",
        "expires_at_1": f"{later:%H:%M:%S}",
    }
    assert page.status_code == 200
    answer = admin.post(f"/admin/gateway/apikey/{key.pk}/change/", form)
    assert answer.status_code == 302, answer.content.decode()[:3000]
    assert tell_keys_expiring(now=now) == 1  # the new expiry, told once more


def _with_key(key: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return api


def test_a_scoped_expiring_key_makes_and_changes_keys_only_within_its_own_scope(ana):
    qwen = factories.llm("qwen")
    llama = factories.llm("llama")
    tomorrow = timezone.now() + timedelta(days=1)
    scoped, key = api_key_create(user=ana, name="qwen until tomorrow", models=[qwen], expires_at=tomorrow)
    full, _ = api_key_create(user=ana, name="laptop")
    api = _with_key(key)

    # A key asked for with nothing said takes the scope and expiry of the key that asked.
    made = api.post("/api/keys/", {"name": "x"}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["models"] == ["qwen"] and made.json()["expires_at"] is not None
    assert ApiKey.objects.get(pk=made.json()["id"]).expires_at == scoped.expires_at
    # Wider than itself: refused, naming the scope; nothing made.
    before = ApiKey.objects.count()
    for wider in (
        {"name": "y", "models": []},
        {"name": "y", "models": ["llama"]},
        {"name": "y", "models": ["qwen", "llama"]},
        {"name": "y", "expires_at": None},
        {"name": "y", "expires_at": (tomorrow + timedelta(days=1)).isoformat()},
    ):
        refused = api.post("/api/keys/", wider, format="json")
        assert refused.status_code == 403, (wider, refused.content)
        assert refused.json()["code"] == "key_scope" and "this API key" in refused.json()["message"], wider
    assert ApiKey.objects.count() == before
    # Narrower is fine.
    soon = (timezone.now() + timedelta(hours=2)).isoformat()
    assert api.post("/api/keys/", {"name": "z", "expires_at": soon}, format="json").status_code == 201

    # It cannot widen itself ...
    widened = api.patch(f"/api/keys/{scoped.pk}/", {"models": [], "expires_at": None}, format="json")
    assert widened.status_code == 403 and widened.json()["code"] == "key_scope", widened.content
    scoped.refresh_from_db()
    assert [m.name for m in scoped.models_allowed.all()] == ["qwen"] and scoped.expires_at is not None
    assert api.patch(f"/api/keys/{scoped.pk}/", {"models": [llama.pk]}, format="json").status_code == 403
    # ... nor change or revoke a key wider than itself (the owner's full key) ...
    assert api.patch(f"/api/keys/{full.pk}/", {"models": ["qwen"]}, format="json").status_code == 403
    assert api.delete(f"/api/keys/{full.pk}/").status_code == 403
    full.refresh_from_db()
    assert full.revoked_at is None and not full.models_allowed.exists()
    # ... but renames itself, and revokes a key within its scope.
    assert api.patch(f"/api/keys/{scoped.pk}/", {"name": "renamed"}, format="json").status_code == 200
    assert api.delete(f"/api/keys/{made.json()['id']}/").status_code == 204

    # The owner's unscoped key (or the portal's session) may do all of it.
    _, anything = api_key_create(user=ana, name="admin's")
    assert (
        _with_key(anything).patch(f"/api/keys/{scoped.pk}/", {"models": []}, format="json").status_code == 200
    )


def test_a_key_limited_to_channels_makes_keys_limited_to_those_channels(ana):
    a, b = factories.channel("a100-0"), factories.channel("a100-1")
    _, key = api_key_create(user=ana, name="a only", channels=[a])
    api = _with_key(key)
    made = api.post("/api/keys/", {"name": "x"}, format="json")
    assert made.status_code == 201 and made.json()["channels"] == ["a100-0"], made.content
    assert api.post("/api/keys/", {"name": "y", "channels": [b.name]}, format="json").status_code == 403
    assert api.post("/api/keys/", {"name": "y", "channels": []}, format="json").status_code == 403


def test_a_read_only_key_does_not_read_webhook_secrets(ana):
    from reservations.webhooks.services import webhook_create

    webhook = webhook_create(owner=ana, url="https://example.org/hook")
    _, reader = api_key_create(user=ana, name="dashboard", read_only=True)
    listed = _with_key(reader).get("/api/webhooks/")
    assert listed.status_code == 200 and listed.json()[0]["url"] == "https://example.org/hook"
    assert "secret" not in listed.json()[0] and webhook.secret not in listed.content.decode()
    one = _with_key(reader).get(f"/api/webhooks/{webhook.pk}/")
    assert one.status_code == 200 and webhook.secret not in one.content.decode()
    # A key that may change things (and the portal) shows it, to set up a receiver.
    _, writer = api_key_create(user=ana, name="ci")
    assert _with_key(writer).get("/api/webhooks/").json()[0]["secret"] == webhook.secret


def test_a_model_scoped_key_is_held_to_what_the_process_serves_not_what_the_body_names(gateway_url, world):
    """ch-a serves qwen; a key limited to llama names llama (or nothing) on ch-a's pinned path, or
    during its owner's own booking of ch-a: refused, for the process there serves qwen."""
    _, only_llama = api_key_create(user=world.ana, name="llama only", models=[world.other_model])
    snapshot_seen(gateway_url)
    assert call(gateway_url, only_llama, model="llama").status_code == 200  # ch-b serves it
    before = world.log.read_text()
    for answer in (
        call(gateway_url + "/channels/ch-a", only_llama, model="llama"),
        call(gateway_url + "/channels/ch-a", only_llama, model="llama", path="/completion", prompt="hi"),
        httpx.post(
            gateway_url + "/channels/ch-a/completion",
            json={"prompt": "hi"},
            headers={"Authorization": f"Bearer {only_llama}"},
            timeout=30,
        ),
    ):
        assert error(answer) == (403, "key_scope"), answer.text
        assert "may not call model qwen" in answer.json()["error"]["message"]
    book(world, "ana")
    snapshot_seen(gateway_url)
    for named in ("llama", None):
        body = {"messages": [{"role": "user", "content": "hi"}], **({"model": named} if named else {})}
        answer = httpx.post(
            gateway_url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {only_llama}"},
            timeout=30,
        )
        assert error(answer) == (403, "key_scope"), (named, answer.text)
    assert world.log.read_text() == before  # nothing reached ch-a's process


def test_a_staff_key_limited_to_a_channel_changes_only_that_channel_through_the_api(staff):
    """A key's channel scope limits what it changes through the REST API as it limits what it
    calls (docs/api.md): its channel's settings, override and reload; not another channel, not
    the inventory every channel shares, not the audit trail of every channel."""
    mine, other = factories.channel("mine-0"), factories.channel("other-0")
    qwen = factories.llm("qwen")
    _, key = api_key_create(user=staff, name="ops", channels=[mine], models=[qwen])
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    until = (timezone.now() + timedelta(hours=1)).isoformat()
    assert (
        api.patch(f"/api/channels/{mine.pk}/", {"approval_policy": "all"}, format="json").status_code == 200
    )
    assert api.post(f"/api/channels/{mine.pk}/reload").status_code == 202
    assert (
        api.post(
            f"/api/channels/{mine.pk}/override", {"model": "qwen", "until": until}, format="json"
        ).status_code
        == 201
    )
    refused = [
        api.patch(f"/api/channels/{other.pk}/", {"approval_policy": "all"}, format="json"),
        api.post(f"/api/channels/{other.pk}/reload"),
        api.post(f"/api/channels/{other.pk}/override", {"model": "qwen", "until": until}, format="json"),
        api.delete(f"/api/channels/{other.pk}/"),
        api.post(
            "/api/channels/", {"name": "new-0", "node": mine.node_id, "gpu_indexes": [5]}, format="json"
        ),
        api.patch(f"/api/models/{qwen.pk}/", {"labels": ["x"]}, format="json"),
        api.patch(f"/api/nodes/{mine.node_id}/", {"labels": ["x"]}, format="json"),
        api.get("/api/audit/"),
    ]
    for answer in refused:
        assert answer.status_code == 403, (
            answer.request["PATH_INFO"],
            answer.status_code,
            answer.content[:300],
        )
        assert answer.json()["code"] == "key_scope", answer.json()
        assert "mine-0" in answer.json()["message"]
    other.refresh_from_db()
    assert other.approval_policy != "all"
    # Reading stays as it was: the channels list, the other channel's plan.
    assert api.get(f"/api/channels/{other.pk}/").status_code == 200
    # An unscoped key of the same person may do all of it.
    _, wide = api_key_create(user=staff, name="all")
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {wide}")
    assert (
        api.patch(f"/api/channels/{other.pk}/", {"approval_policy": "all"}, format="json").status_code == 200
    )
    assert api.get("/api/audit/").status_code == 200
