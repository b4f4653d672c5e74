"""API keys: created by a command or the API, shown once, stored hashed, revocable."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from gateway.models import ApiKey, hash_key


def test_command_prints_only_the_key_and_the_key_works(ana):
    out = StringIO()
    call_command("apikey", "create", "ana", stdout=out)
    key = out.getvalue().strip()
    assert key.startswith("ss-") and "\n" not in key and len(key) > 40
    stored = ApiKey.objects.get(user=ana)
    assert stored.hashed == hash_key(key) and key not in stored.hashed

    client = APIClient()
    assert client.get("/api/channels/").status_code == 401
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get("/api/channels/").status_code == 200
    client.credentials(HTTP_AUTHORIZATION="Bearer ss-wrong")
    answer = client.get("/api/channels/")
    assert answer.status_code == 401
    assert "unknown or has been revoked" in answer.data["message"]


def test_command_names_an_unknown_user(db):
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        call_command("apikey", "create", "nobody")


def test_keys_api_shows_the_key_once_and_revokes(ana_api, bo_api):
    made = ana_api.post("/api/keys/", {"name": "laptop"})
    assert made.status_code == 201
    key = made.data["key"]
    listed = ana_api.get("/api/keys/").data
    assert [k["name"] for k in listed] == ["laptop"] and "key" not in listed[0]
    assert bo_api.get("/api/keys/").data == []
    assert bo_api.delete(f"/api/keys/{made.data['id']}/").status_code == 404

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get("/api/keys/").status_code == 200
    assert ana_api.delete(f"/api/keys/{made.data['id']}/").status_code == 204
    assert client.get("/api/keys/").status_code == 401
    assert ana_api.post("/api/keys/", {"name": ""}).status_code == 400
