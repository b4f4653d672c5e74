"""Hostile and careless input gets a clear 4xx JSON answer naming what is wrong — never a 500 —
and changes nothing (docs/security.md). One table per edge: the REST API, the portal, the gateway."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import httpx
import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from channels_app.models import Channel, ChannelRuntime, LLMModel, Node, Override, Preset
from gateway.api_keys import api_key_create
from reservations.models import Reservation, ReservationStatus
from slotserve_base.csv_cells import SafeWriter
from tests import factories
from tests.conftest import serve
from tests.factories import iso
from tests.world import World

HUGE = "x" * 200_000


@pytest.fixture
def world(db, ana, staff):
    node = factories.node("n1")
    target = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("ch", on=node, default=target)
    start = timezone.now().replace(microsecond=0) + timedelta(hours=2)
    booked = factories.reservation(
        owner=ana, on=channel, start=start, end=start + timedelta(hours=1), target=target
    )
    return World(
        channel=channel, model=target.model, preset=target, node=node, ana=ana, booked=booked, start=start
    )


def _rows() -> dict[str, object]:
    return {
        "reservations": sorted(
            Reservation.objects.values_list("pk", "status", "start", "end", "channel_id", "note")
        ),
        "presets": sorted(Preset.objects.values_list("pk", "name", "args")),
        "models": sorted(LLMModel.objects.values_list("pk", "name")),
        "nodes": sorted(Node.objects.values_list("pk", "name")),
        "channels": sorted(Channel.objects.values_list("pk", "name", "default_model_id")),
        "overrides": sorted(Override.objects.values_list("pk", "until")),
    }


def _booking(world, **changes):
    body = {
        "channel": world.channel.pk,
        "start": iso(world.start + timedelta(hours=3)),
        "end": iso(world.start + timedelta(hours=4)),
        "model": world.preset.model_id,
    }
    body.update(changes)
    return body


# (who, method, path, body or query, status, words the message must contain)
API_CASES = [
    (
        "ana",
        "post",
        "/api/reservations/",
        {"start": "9999-12-31T23:00:00Z", "end": "9999-12-31T23:59:00Z"},
        400,
        "start",
    ),
    (
        "ana",
        "post",
        "/api/reservations/",
        {"start": "0001-01-01T00:00:00Z", "end": "0001-01-01T01:00:00Z"},
        400,
        "start",
    ),
    ("ana", "post", "/api/reservations/", {"start": "9999-12-31T23:00:00-05:00"}, 400, "start"),
    ("ana", "post", "/api/reservations/", {"note": "a\x00b"}, 400, "note"),
    ("ana", "post", "/api/reservations/", {"note": HUGE}, 400, "note"),
    ("ana", "post", "/api/reservations/", {"model": HUGE}, 400, "model"),
    ("ana", "post", "/api/reservations/", {"model": ["qwen"]}, 400, "model"),
    ("ana", "post", "/api/reservations/", {"channel": {"id": 1}}, 400, "channel"),
    ("ana", "post", "/api/reservations/", {"start": 12345}, 400, "start"),
    ("ana", "post", "/api/reservations/", {"exclusive": "maybe"}, 400, "exclusive"),
    ("ana", "post", "/api/reservations/", {"start": "2026-13-40T25:61:00Z"}, 400, "start"),
    ("ana", "get", "/api/channels/{channel}/decision", {"at": "0001-01-01T00:00:00Z"}, 400, "at"),
    ("ana", "get", "/api/channels/{channel}/decision", {"at": "9999-12-31T23:59:59Z"}, 400, "at"),
    ("ana", "get", "/api/channels/abc/decision", {}, 404, "not found"),
    ("ana", "get", "/api/channels/{channel}/plan", {"from": "9999-12-31T00:00:00Z"}, 400, "from"),
    (
        "ana",
        "get",
        "/api/channels/{channel}/plan",
        {"from": "0001-01-01T00:00:00Z", "to": "0001-01-02T00:00:00Z"},
        400,
        "from",
    ),
    (
        "ana",
        "get",
        "/api/placement",
        {"model": "qwen", "start": "9999-12-31T22:00:00Z", "end": "9999-12-31T23:00:00Z"},
        400,
        "start",
    ),
    (
        "ana",
        "get",
        "/api/placement",
        {"model": "qwen", "start": "0001-01-01T00:00:00Z", "end": "0001-01-01T01:00:00Z"},
        400,
        "start",
    ),
    (
        "ana",
        "get",
        "/api/reservations/hints",
        {
            "channel": "{channel}",
            "start": "9999-12-31T22:00:00Z",
            "end": "9999-12-31T23:00:00Z",
            "model": "qwen",
        },
        400,
        "start",
    ),
    ("ana", "post", "/api/reservations/{booked}/extend", {"end": "9999-12-31T23:59:59Z"}, 400, "end"),
    (
        "staff",
        "post",
        "/api/channels/{channel}/override",
        {"model": "qwen", "until": "9999-12-31T23:59:59-05:00"},
        400,
        "until",
    ),
    ("staff", "delete", "/api/models/{model}/", {}, 409, "reservation"),
    ("staff", "delete", "/api/presets/{preset}/", {}, 409, "reservation"),
    ("staff", "delete", "/api/nodes/{node}/", {}, 409, "channel ch"),
    ("staff", "post", "/api/presets/", {"model": "qwen", "name": "x", "args": "-c 'open"}, 400, "args"),
    (
        "staff",
        "post",
        "/api/channels/",
        {"name": "c2", "node": "n1", "gpu_indexes": "zero"},
        400,
        "gpu_indexes",
    ),
]


def _fill(path_or_value, world):
    if not isinstance(path_or_value, str):
        return path_or_value
    return path_or_value.format(
        channel=world.channel.pk,
        booked=world.booked.pk,
        model=world.preset.model_id,
        preset=world.preset.pk,
        node=world.node.pk,
    )


@pytest.mark.parametrize(("who", "method", "path", "data", "status", "words"), API_CASES)
def test_bad_api_input_is_a_named_4xx_and_changes_nothing(
    world, ana, staff, who, method, path, data, status, words
):
    client = APIClient()
    client.force_authenticate(staff if who == "staff" else ana)
    path = _fill(path, world)
    data = {k: _fill(v, world) for k, v in data.items()}
    if path == "/api/reservations/" and method == "post":
        data = _booking(world, **data)
    before = _rows()
    send = getattr(client, method)
    answer = send(path, data) if method == "get" else send(path, data, format="json")
    assert answer.status_code == status, answer.content[:500]
    body = answer.json()
    message = json.dumps(body).lower()
    assert words.lower() in message, body
    assert _rows() == before


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path", ["/api/reservations/", "/api/channels/", "/api/me/", "/api/docs/", "/api/schema/"]
)
def test_without_signing_in_html_or_json_is_never_a_500(path):
    for accept in ("text/html", "application/json", "*/*"):
        answer = Client().get(path, HTTP_ACCEPT=accept)
        assert answer.status_code in {200, 401, 403}, (path, accept, answer.status_code)
        if answer.status_code != 200:
            assert answer["Content-Type"].startswith("application/json")


@pytest.mark.django_db
@pytest.mark.parametrize("day", ["9999-12-31", "0001-01-01", "2026-02-30", "x" * 300])
def test_calendar_days_at_the_ends_of_time(world, ana, day):
    client = Client()
    client.force_login(ana)
    for view in ("day", "week"):
        answer = client.get("/calendar/", {"day": day, "view": view})
        assert answer.status_code in {200, 400}, (day, view, answer.status_code)


@pytest.mark.django_db
def test_deleting_the_model_a_channel_runs_is_refused_by_name(world, staff):
    runner = factories.llm("runner")
    ChannelRuntime.objects.create(channel=world.channel, phase="ready", model=runner, port=1, pid=1)
    client = APIClient()
    client.force_authenticate(staff)
    answer = client.delete(f"/api/models/{runner.pk}/")
    assert answer.status_code == 409 and "channel ch" in answer.json()["message"]
    assert LLMModel.objects.filter(pk=runner.pk).exists()


@pytest.mark.django_db
def test_a_usage_flush_for_a_deleted_user_drops_its_counts(world, bo):
    from gateway.usage.flush import flush_usage
    from gateway.wire.counters import USAGE_RESERVATION, USAGE_USER, key
    from slotserve_base.redis_client import redis_client

    client = redis_client()
    client.hset(key(USAGE_USER, bo.pk), mapping={"requests": 2, "prompt_tokens": 5})
    client.hset(key(USAGE_RESERVATION, 987654), mapping={"requests": 1})
    client.hset(key(USAGE_USER, world.booked.user_id), mapping={"requests": 3})
    bo.delete()
    assert flush_usage(client) == 1  # the user still here
    assert not list(client.scan_iter(match=key("usage:*", "*")))


# --- The gateway ---------------------------------------------------------------------------

GATEWAY_CASES = [
    (b"", 400, "empty"),
    (b"[" * 20_000 + b"]" * 20_000, 400, "nested"),
    (b'{"model": "qwen", "messages": [], "stream": "true"}', 400, "stream must be a boolean"),
    (b'{"model": "qwen", "messages": [], "stream": 1}', 400, "stream must be a boolean"),
    (b'{"model": ["qwen"], "messages": []}', 400, "model must be a string"),
    (b'{"model": "qwen", "messages": [], "stream_options": "yes"}', 400, "stream_options"),
    (b"\xff\xfe not json", 400, "not valid JSON"),
    (b'"just a string"', 400, "JSON object"),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("raw", "status", "words"), GATEWAY_CASES)
def test_bad_gateway_bodies_are_a_named_400(gateway_url, standins, ana, raw, status, words):
    model = factories.llm("qwen")
    channel = factories.channel("gw")
    port, _ = standins("qwen")
    serve(channel, model, port)
    _, api_key = api_key_create(user=ana, name="t")
    answer = httpx.post(
        gateway_url + "/v1/chat/completions",
        content=raw,
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == status, answer.text[:300]
    error = answer.json()["error"]
    assert words.lower() in error["message"].lower(), error
    assert error["code"] == "invalid_request"


@pytest.mark.django_db(transaction=True)
def test_a_channel_whose_model_was_deleted_answers_a_clear_error(gateway_url, standins, ana):
    model = factories.llm("gone")
    channel = factories.channel("orphan")
    port, _ = standins("gone")
    serve(channel, model, port)
    ChannelRuntime.objects.filter(channel=channel).update(model=None)  # as SET_NULL leaves it
    _, api_key = api_key_create(user=ana, name="t")
    answer = httpx.post(
        gateway_url + "/channels/orphan/v1/chat/completions",
        json={"model": "gone", "messages": []},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=30,
    )
    assert answer.status_code in {404, 503}, answer.text
    assert answer.json()["error"]["code"] in {"model_not_loaded", "model_loading"}


BIG_ID = "9" * 20  # beyond any database's integer


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        f"/api/requests/?channel={BIG_ID}",
        f"/api/requests/?user={BIG_ID}",
        f"/api/reservations/?channel={BIG_ID}",
        f"/api/requests/csv?channel={BIG_ID}",
        f"/requests/?channel={BIG_ID}",
        f"/requests/?user={BIG_ID}",
    ],
)
def test_an_id_beyond_the_databases_integer_finds_nothing(world, staff, path):
    client = Client()
    client.force_login(staff)
    answer = client.get(path)
    body = b"".join(answer.streaming_content) if answer.streaming else answer.content  # type: ignore[attr-defined]
    assert answer.status_code in (200, 400), body[:500]
    if answer.status_code == 200 and path.startswith("/api/") and "csv" not in path:
        found = json.loads(body)
        assert (found["count"] if isinstance(found, dict) else len(found)) == 0


@pytest.mark.django_db
@pytest.mark.parametrize("booking", ["²", "١", BIG_ID, "-1", "1.5"])
def test_a_storys_booking_that_is_no_id_is_a_named_400(world, staff, booking):
    client = Client()
    client.force_login(staff)
    for path in (f"/api/channels/{world.channel.pk}/story", f"/channel/{world.channel.pk}/story"):
        answer = client.get(path, {"booking": booking})
        assert answer.status_code in (400, 404), (path, answer.status_code)
        assert b"booking" in answer.content


ESCAPING = "application/x-www-form-urlencoded; charset=unicode_escape"


@pytest.mark.django_db
@pytest.mark.parametrize("where", ["/api/keys/", "/api/webhooks/", "/api/reservations/", "/api/waitlist/"])
def test_a_form_body_in_a_charset_that_makes_lone_surrogates_is_refused_400_by_the_api(ana, where):
    factories.channel("a100-0")
    api = APIClient()
    api.force_authenticate(ana)
    answer = api.generic("POST", where, b"name=%5Cud800&url=%5Cud800&channel=a100-0", content_type=ESCAPING)
    assert answer.status_code == 400, answer.content
    assert "charset" in answer.json()["message"] and "UTF-8" in answer.json()["message"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "where", ["/book/", "/keys/", "/webhooks/", "/settings/", "/settings/time-zone", "/approvals/approve"]
)
def test_a_form_body_in_a_charset_that_makes_lone_surrogates_is_refused_400_by_the_portal(staff, where):
    browser = Client()
    browser.force_login(staff)
    answer = browser.generic("POST", where, b"name=%5Cud800&reservation=1", content_type=ESCAPING)
    assert answer.status_code == 400, (where, answer.status_code)
    assert b"UTF-8" in answer.content


@pytest.mark.django_db
def test_a_form_in_utf_8_still_goes_through(ana):
    browser = Client()
    browser.force_login(ana)
    for charset in ("utf-8", "UTF-8"):
        answer = browser.generic(
            "POST",
            "/settings/time-zone",
            b"time_zone=Europe%2FBerlin",
            content_type=f"application/x-www-form-urlencoded; charset={charset}",
        )
        assert answer.status_code in (200, 204, 302), (charset, answer.status_code)


@pytest.mark.django_db
def test_ticks_that_only_look_like_numbers_are_skipped_not_a_500(staff, ana):
    channel = factories.channel("a100-1", policy="all")
    start = timezone.now() + timedelta(days=1)
    asked = factories.reservation(
        owner=ana, on=channel, start=start, end=start + timedelta(hours=1), status=ReservationStatus.PENDING
    )
    browser = Client()
    browser.force_login(staff)
    answer = browser.post("/approvals/approve", {"reservation": ["²", "١", str(asked.pk)]})
    assert answer.status_code == 302
    assert Reservation.objects.get(pk=asked.pk).status == ReservationStatus.APPROVED


@pytest.mark.django_db
def test_csv_cells_with_a_semicolon_are_quoted_for_spreadsheets_that_split_on_it():
    out = io.StringIO()
    SafeWriter(out).writerow(["x;=1+1", "plain", 3, "=SUM(A1)"])
    line = out.getvalue().strip()
    assert '"x;=1+1"' in line and "'=SUM(A1)" in line
    # A spreadsheet that splits on ";" keeps the cell whole (quoted), so its formula is text.
    cells = next(csv.reader(io.StringIO(line), delimiter=";"))
    assert not any(cell.startswith("=") for cell in cells), cells
