"""Side doors a careful attacker found after the first round: text no database can store, the
request log that such text stalled, tokens through a process's own routes, formulas in CSV
exports, a process's admin endpoints, callers held without limit, bodies nested deep, a
Retry-After one second short, and group restrictions through the API."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from channels_app.backends import Backend, effective_args
from gateway.models import ApiKey, RequestLog, SharingLimits
from gateway.stream.events import Usage
from gateway.usage.request_log import flush_request_log
from slotserve_base.redis_client import redis_client
from slotserve_base.vocabulary import RedisKey
from slotserve_base.vocabulary import redis_key as key
from tests import factories
from tests.clock import eventually
from tests.conftest import running_llama_server, serve, snapshot_seen
from tests.test_gateway_http import call, counted_out, error

ROOT = Path(__file__).resolve().parent.parent
LONE_SURROGATE = b'{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}'


def _post_raw(url: str, key_: str, body: bytes, path: str = "/v1/chat/completions", **headers: str):
    return httpx.post(
        url + path,
        content=body,
        headers={"Authorization": f"Bearer {key_}", "Content-Type": "application/json", **headers},
        timeout=30,
    )


# --- Text that no database stores ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_model_name_with_a_lone_surrogate_is_refused_400_at_the_gateway(gateway_url, world):
    answer = _post_raw(gateway_url, world.ana_key, LONE_SURROGATE)
    assert error(answer) == (400, "invalid_request"), answer.text
    assert "model" in answer.json()["error"]["message"]
    anthropic = _post_raw(gateway_url, world.ana_key, LONE_SURROGATE, path="/v1/messages")
    assert anthropic.status_code == 400 and anthropic.json()["type"] == "error"
    # Elsewhere in the body too: a prompt the process would choke on, refused before it goes.
    elsewhere = b'{"model": "qwen", "messages": [{"role": "user", "content": "a\\udc00b"}]}'
    assert error(_post_raw(gateway_url, world.ana_key, elsewhere)) == (400, "invalid_request")
    assert call(gateway_url, world.ana_key).status_code == 200  # the gateway goes on


@pytest.mark.django_db
@pytest.mark.parametrize("where", ["/api/reservations/", "/api/waitlist/"])
@pytest.mark.parametrize("field", ["channel", "model"])
def test_the_rest_api_refuses_text_no_database_stores_with_400(ana, where, field):
    channel = factories.channel("a100-0")
    start = timezone.now() + timedelta(hours=2)
    body = {
        "channel": channel.name,
        "start": start.isoformat(),
        "end": (start + timedelta(hours=1)).isoformat(),
    }
    body[field] = "\ud800"
    raw = json.dumps(body).encode()  # "\ud800" as JSON writes it
    client = APIClient()
    client.force_authenticate(ana)
    answer = client.post(where, raw, content_type="application/json")
    assert answer.status_code == 400, answer.content
    assert "UTF-8" in answer.json()["message"] or "surrogate" in answer.json()["message"]


# --- The request log: a record it cannot write does not stop it --------------------------------


def _record(user_id: int, model: str) -> str:
    return json.dumps([time.time(), user_id, None, None, None, model, "POST", "/v1/x", 404, None, 1.0, 0, 0])


@pytest.mark.django_db(transaction=True)
def test_a_record_the_database_refuses_goes_to_the_dead_letter_list_and_the_log_goes_on(ana, staff):
    client = redis_client()
    waiting, dead = key(RedisKey.REQUEST_LOG, "all"), key(RedisKey.REQUEST_LOG, "dead")
    client.rpush(waiting, _record(ana.pk, "before"), _record(ana.pk, "\ud800"), _record(ana.pk, "nul\x00"))
    client.rpush(waiting, _record(ana.pk, "after"), b"{not json")
    assert flush_request_log(client) == 2
    assert sorted(RequestLog.objects.values_list("model", flat=True)) == ["after", "before"]
    assert client.llen(waiting) == 0
    assert client.llen(dead) == 3
    # The next records are written as usual.
    client.rpush(waiting, _record(ana.pk, "later"))
    assert flush_request_log(client) == 1
    metrics = Client().get("/metrics").content.decode()
    assert "slotserve_request_log_dead_records 3" in metrics


# --- Tokens through a process's own routes ---------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_tokens_through_llama_servers_native_routes_are_counted(
    gateway_url, world, llama_server_bin, tiny_gguf
):
    with running_llama_server(llama_server_bin, tiny_gguf, "--alias", "tiny", "-c", "256", "-t", "1") as port:
        serve(world.other, factories.llm("tiny"), port)
        snapshot_seen(gateway_url)
        asked = {"model": "tiny", "prompt": "Hello", "n_predict": 4, "temperature": 0, "ignore_eos": True}
        for path in ("/completion", "/completions"):
            plain = httpx.post(
                gateway_url + path,
                json=asked,
                headers={"Authorization": f"Bearer {world.bo_key}"},
                timeout=30,
            )
            assert plain.status_code == 200, plain.text
            assert plain.json()["tokens_predicted"] == 4
            with httpx.stream(
                "POST",
                gateway_url + path,
                json={**asked, "stream": True},
                headers={"Authorization": f"Bearer {world.bo_key}"},
                timeout=30,
            ) as streamed:
                events = [line for line in streamed.iter_lines() if line.startswith("data: ")]
            assert streamed.status_code == 200 and json.loads(events[-1][6:])["stop"] is True
    counted_out(world.other)
    flush_request_log(redis_client())
    rows = list(
        RequestLog.objects.filter(path__in=["/completion", "/completions"]).values_list(
            "prompt_tokens", "completion_tokens"
        )
    )
    assert len(rows) == 4
    assert all(completion == 4 and prompt > 0 for prompt, completion in rows), rows


def test_an_answer_whose_tokens_cannot_be_read_is_charged_what_the_request_allowed():
    assert Usage.asking({"max_tokens": 300}).settled().completion == 300
    assert Usage.asking({"n_predict": 50}).settled().completion == 50
    assert Usage.asking({"max_completion_tokens": 70, "max_tokens": 9}).settled().completion == 70
    read = Usage.asking({"max_tokens": 300})
    read.add({"usage": {"prompt_tokens": 3, "completion_tokens": 12}})
    assert (read.settled().prompt, read.settled().completion) == (3, 12)
    native = Usage.asking({"n_predict": 50})
    native.add({"content": "…", "tokens_predicted": 7, "tokens_evaluated": 5})
    assert (native.prompt, native.completion) == (5, 7)
    sglang = Usage.asking({})
    sglang.add({"text": "…", "meta_info": {"prompt_tokens": 4, "completion_tokens": 9}})
    assert (sglang.prompt, sglang.completion) == (4, 9)


def test_every_field_that_limits_an_answer_and_anthropics_cached_prompt_are_counted():
    assert Usage.asking({"max_output_tokens": 400}).settled().completion == 400  # Responses API
    cached = Usage.asking({"max_tokens": 50})
    cached.add({"usage": {"input_tokens": 1, "cache_read_input_tokens": 280, "output_tokens": 5}})
    assert (cached.prompt, cached.completion) == (281, 5)
    # Streamed: message_start has the prompt, message_delta the output so far.
    streamed = Usage.asking({"max_tokens": 50})
    streamed.add(
        {
            "type": "message_start",
            "message": {"usage": {"input_tokens": 3, "cache_creation_input_tokens": 7, "output_tokens": 1}},
        }
    )
    streamed.add({"type": "message_delta", "usage": {"output_tokens": 12}})
    assert (streamed.prompt, streamed.completion) == (10, 12)


def _hang_up_after(url: str, key: str, path: str, body: dict[str, Any], events: int) -> int:
    """Stream ``body`` and hang up after ``events`` data events; how many came."""
    seen = 0
    with httpx.stream(
        "POST", url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as streamed:
        assert streamed.status_code == 200
        for line in streamed.iter_lines():
            if line.startswith("data: {"):
                seen += 1
                if seen >= events:
                    break
    return seen


@pytest.mark.django_db(transaction=True)
def test_a_stream_hung_up_before_its_usage_is_charged_what_was_sent_or_allowed(
    gateway_url, world, llama_server_bin, tiny_gguf
):
    """Streams whose usage never comes (the caller hangs up first) are charged at least the
    events they were sent, or what their request allowed (``max_output_tokens`` included)."""
    # -n: the server's own cap on an answer that sets none, so a stream nobody reads ends soon.
    args = ("--alias", "tiny", "-c", "512", "-n", "120", "-t", "1")
    with running_llama_server(llama_server_bin, tiny_gguf, *args) as port:
        serve(world.other, factories.llm("tiny"), port)
        snapshot_seen(gateway_url)
        chat = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Hello"}],
            "stream": True,
            "temperature": 0,
            "ignore_eos": True,
        }
        sent = [_hang_up_after(gateway_url, world.bo_key, "/v1/chat/completions", chat, 40) for _ in range(3)]
        responses = {
            "model": "tiny",
            "input": "Hello",
            "stream": True,
            "max_output_tokens": 400,
            "ignore_eos": True,
        }
        _hang_up_after(gateway_url, world.bo_key, "/v1/responses", responses, 30)
    counted_out(world.other)
    flush_request_log(redis_client())
    chats = list(
        RequestLog.objects.filter(path="/v1/chat/completions").values_list("completion_tokens", flat=True)
    )
    assert len(chats) == 3 and all(tokens >= 38 for tokens in chats), (chats, sent)
    assert list(
        RequestLog.objects.filter(path="/v1/responses").values_list("completion_tokens", flat=True)
    ) == [400]


# --- CSV exports never write formulas -----------------------------------------------------------


@pytest.mark.django_db
def test_the_request_log_csv_neutralises_formulas(staff, ana):
    hostile = ApiKey.objects.create(user=ana, name='=HYPERLINK("http://evil")', prefix="x", hashed="h" * 64)
    for model in ("+cmd", "-2+3", "@SUM(A1)", "\tTAB", "\rCR", "plain"):
        RequestLog.objects.create(
            at=timezone.now(),
            user=ana,
            key=hostile,
            model=model,
            method="POST",
            path="/v1/x",
            status=200,
            duration_ms=1.0,
        )
    client = APIClient()
    client.force_authenticate(staff)
    answer = client.get("/api/requests/csv")
    rows = list(csv.reader(io.StringIO(answer.getvalue().decode())))
    header, body = rows[0], rows[1:]
    models = {row[header.index("model")] for row in body}
    assert models == {"'+cmd", "'-2+3", "'@SUM(A1)", "'\tTAB", "'\rCR", "plain"}
    assert {row[header.index("key")] for row in body} == {'\'=HYPERLINK("http://evil")'}


@pytest.mark.django_db
def test_the_usage_csv_neutralises_formulas(staff, ana):
    group = Group.objects.create(name="=cmd|' /C calc'!A0")
    ana.groups.add(group)
    RequestLog.objects.create(
        at=timezone.now(),
        user=ana,
        model="m",
        method="POST",
        path="/v1/x",
        status=200,
        duration_ms=1.0,
        prompt_tokens=3,
        completion_tokens=4,
    )
    client = Client()
    client.force_login(staff)
    answer = client.get(
        "/usage/csv", {"by": "group", "period": "day", "day": timezone.now().date().isoformat()}
    )
    assert answer.status_code == 200, answer.content
    cells = [cell for row in csv.reader(io.StringIO(answer.content.decode())) for cell in row]
    assert "'=cmd|' /C calc'!A0" in cells and "=cmd|' /C calc'!A0" not in cells


# --- A process's admin endpoints ------------------------------------------------------------


def test_presets_cannot_open_llama_servers_admin_endpoints():
    given = ["--slot-save-path", "/tmp/slots", "--props", "--path", "/etc", "--api-prefix", "/x", "-c", "512"]
    assert effective_args(Backend.LLAMA_CPP, given) == ["-c", "512"]
    assert effective_args(Backend.LLAMA_CPP, ["--slot-save=/tmp", "--pat", "/etc", "-t", "2"]) == ["-t", "2"]


@pytest.mark.django_db(transaction=True)
def test_the_pinned_path_passes_a_process_admin_endpoints_to_staff_only(gateway_url, world, staff):
    from gateway.api_keys import api_key_create

    _, staff_key = api_key_create(user=staff, name="t")
    snapshot_seen(gateway_url)
    base = gateway_url + "/channels/ch-a"
    refused = [
        httpx.get(base + "/slots", headers={"Authorization": f"Bearer {world.ana_key}"}, timeout=10),
        httpx.post(
            base + "/slots/0?action=save",
            json={"filename": "x"},
            headers={"Authorization": f"Bearer {world.ana_key}"},
            timeout=10,
        ),
        httpx.post(
            base + "/props",
            json={"n_ctx": 1},
            headers={"Authorization": f"Bearer {world.ana_key}"},
            timeout=10,
        ),
        httpx.post(
            base + "/lora-adapters", json=[], headers={"Authorization": f"Bearer {world.ana_key}"}, timeout=10
        ),
    ]
    for answer in refused:
        assert error(answer) == (403, "admin_only"), answer.text
    assert "POST /props" not in world.log.read_text() and "/slots" not in world.log.read_text()
    # Reading the settings is harmless; staff reach the endpoints (the stand-in has none: 404).
    assert (
        httpx.get(
            base + "/props", headers={"Authorization": f"Bearer {world.ana_key}"}, timeout=10
        ).status_code
        != 403
    )
    mine = httpx.get(base + "/slots", headers={"Authorization": f"Bearer {staff_key}"}, timeout=10)
    assert mine.status_code == 404 and "no route /slots" in mine.text


# --- Held callers are limited ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_caller_cannot_hold_more_requests_than_their_limit(gateway_url, world, settings):
    settings.SLOTSERVE_GATEWAY_MAX_HELD_PER_USER = 3
    serve(world.channel, world.model, None, phase="loading")
    SharingLimits.objects.create(user=world.bo, max_concurrent=2)
    snapshot_seen(gateway_url)
    answers: list[httpx.Response] = []

    def hold(who: str, seconds: str = "4") -> httpx.Response:
        return httpx.post(
            gateway_url + "/v1/chat/completions",
            json={"model": "qwen", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {getattr(world, f'{who}_key')}", "X-SlotServe-Wait": seconds},
            timeout=30,
        )

    def held(who: str) -> None:
        answers.append(hold(who))

    threads = [threading.Thread(target=held, args=("bo",)) for _ in range(2)]
    threads += [threading.Thread(target=held, args=("ana",)) for _ in range(3)]
    for thread in threads:
        thread.start()
    held_of = {who: key(RedisKey.HELD, getattr(world, who).pk) for who in ("ana", "bo")}
    assert eventually(lambda: [redis_client().zcard(held_of[who]) for who in ("bo", "ana")] == [2, 3])
    # bo's limit is 2 at once, held requests included; ana has none of her own: the cap of 3.
    third, fourth = hold("bo"), hold("ana")
    assert error(third) == (429, "too_many_held"), third.text
    assert error(fourth) == (429, "too_many_held"), fourth.text
    assert int(third.headers["Retry-After"]) >= 1
    for thread in threads:
        thread.join()
    assert [error(a)[1] for a in answers] == ["model_loading"] * 5  # held to the end, as asked
    # Once they are answered, the caller may be held again.
    again = hold("bo", "1")
    assert error(again) == (503, "model_loading")


def test_run_gives_the_web_server_a_connection_limit(monkeypatch):
    from slotserve_site.running.parts import web_options

    monkeypatch.setattr("django.conf.settings.SLOTSERVE_GATEWAY_MAX_CONNECTIONS", 123, raising=False)
    options = web_options()
    assert options["limit_concurrency"] == 123
    assert options["proxy_headers"] is False  # the client's address is the socket's (docs/security.md)


# --- Bodies nested deep -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("depth", [600, 1000, 5000, 30_000])
def test_a_body_nested_deep_is_refused_400_in_the_callers_shape(gateway_url, world, depth):
    nested = b'{"model": "qwen", "x": ' + b"[" * depth + b"]" * depth + b"}"
    answer = _post_raw(gateway_url, world.ana_key, nested)
    assert error(answer) == (400, "invalid_request"), answer.text[:300]
    assert "nested" in answer.json()["error"]["message"]
    anthropic = _post_raw(gateway_url, world.ana_key, nested, path="/v1/messages")
    assert anthropic.status_code == 400 and anthropic.json()["error"]["type"] == "invalid_request_error"


# --- Retry-After is never shorter than the real wait -----------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_per_minute_retry_after_is_never_shorter_than_the_wait(gateway_url, world):
    ApiKey.objects.filter(user=world.bo).update(requests_per_minute=1)
    snapshot_seen(gateway_url)
    assert call(gateway_url, world.bo_key).status_code == 200
    key_id = ApiKey.objects.get(user=world.bo).pk
    rate = key(RedisKey.RATE, f"key-{key_id}")
    redis_client().pexpire(rate, 1400)  # the window's edge: 1.4 s left
    refused = call(gateway_url, world.bo_key)
    left = redis_client().pttl(rate) / 1000  # the wait still left once answered (a loaded machine
    # may take more than the 0.4 s past the whole second before the gateway answers)
    assert error(refused) == (429, "rate_limit_exceeded")
    assert left > 0 and int(refused.headers["Retry-After"]) >= left


# --- Group restrictions through the API ------------------------------------------------------


@pytest.mark.django_db
def test_allowed_groups_can_be_set_through_the_channels_api(staff_api):
    Group.objects.create(name="vision")
    node = factories.node("n9")
    made = staff_api.post(
        "/api/channels/",
        {"name": "g-0", "node": node.name, "gpu_indexes": [0], "allowed_groups": ["vision"]},
        format="json",
    )
    assert made.status_code == 201, made.content
    assert made.data["allowed_groups"] == ["vision"]
    changed = staff_api.patch(f"/api/channels/{made.data['id']}/", {"allowed_groups": []}, format="json")
    assert changed.status_code == 200 and changed.data["allowed_groups"] == []
    unknown = staff_api.patch(
        f"/api/channels/{made.data['id']}/", {"allowed_groups": ["nope"]}, format="json"
    )
    assert unknown.status_code == 400 and "nope" in json.dumps(unknown.json())


# --- SQLite named in DATABASE_URL ---------------------------------------------------------------


def test_a_sqlite_database_url_gets_the_same_safety_as_the_default(tmp_path):
    code = (
        "import django; django.setup(); from django.conf import settings; "
        "d = settings.DATABASES['default']; o = d['OPTIONS']; "
        "print(o['transaction_mode'], o['timeout'], 'WAL' in o['init_command'], d['CONN_MAX_AGE'])"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "slotserve_site.settings",
            "DATABASE_URL": f"sqlite:///{tmp_path}/elsewhere.sqlite3",
            "SLOTSERVE_DATA_DIR": str(tmp_path / "data"),
        },
        capture_output=True,
        text=True,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == ["IMMEDIATE", "20", "True", "0"]


@pytest.mark.django_db
def test_no_door_names_a_model_like_an_alias(staff):
    """The REST API refused a model named like an alias; the admin and the portal's "register"
    took it, and the gateway could no longer tell which one a request names. One rule, every door."""
    from channels_app.models import LLMModel, ModelAlias, ModelFile

    staff.is_superuser = True
    staff.save()
    qwen = factories.llm("qwen")
    ModelAlias.objects.create(name="gpt-4o-mini", model=qwen)
    node = factories.node("n1")
    admin = Client()
    admin.force_login(staff)
    form = {
        "backend": "llama.cpp", "path": "/models/x.gguf", "size_bytes": "1", "labels": "",
        "placement_strategy": "binpack", "created_0": "2026-12-06", "created_1": "10:00:00",
        **{f"{each}-{n}": "0" for each in ("presets", "aliases") for n in ("TOTAL_FORMS", "INITIAL_FORMS")},
    }  # fmt: skip
    page = admin.post("/admin/channels_app/llmmodel/add/", {**form, "name": "gpt-4o-mini"})
    assert page.status_code == 200 and "is an alias of model qwen" in page.content.decode()
    # (the same form with a name of its own is taken: the alias is what it was refused for)
    assert admin.post("/admin/channels_app/llmmodel/add/", {**form, "name": "fresh"}).status_code == 302
    found = ModelFile.objects.create(
        node=node, path="/models/gpt-4o-mini.gguf", backend="llama.cpp", size_bytes=1, modified=timezone.now()
    )
    registered = admin.post(f"/models/files/{found.pk}/register", follow=True)
    assert (
        "Not registered" in registered.content.decode()
        and "is an alias of model qwen" in registered.content.decode()
    )
    assert not LLMModel.objects.filter(name="gpt-4o-mini").exists()
    api = APIClient()
    api.force_authenticate(staff)
    refused = api.post(
        "/api/models/", {"name": "gpt-4o-mini", "backend": "llama.cpp", "path": "/m.gguf"}, format="json"
    )
    assert refused.status_code == 400 and "alias" in str(refused.json())
