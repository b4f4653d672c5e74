"""``gateway.serve.server``: the gateway's own HTTP/1.1 server in front of uvicorn's, over real
sockets: gateway requests served by it, every other request (and the rest of its connection)
handed to uvicorn on the same port, answers framed as HTTP/1.1 says."""

from __future__ import annotations

import json
import socket
import time
from collections import deque

import httptools
import pytest

from gateway.serve import fast_lane, http_cycle
from tests.clock import eventually
from tests.conftest import SERVING_SERVERS, serving

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = [{"role": "user", "content": "hi"}]
CHAT = json.dumps({"model": "qwen", "messages": MESSAGES}).encode()
STREAM = json.dumps({"model": "qwen", "messages": MESSAGES, "stream": True}).encode()


class Answer:
    """One HTTP answer read off a socket with llhttp: status, headers (in order), body."""

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""
        self.done = False
        self.status = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.done = True

    def header(self, name: bytes) -> list[bytes]:
        return [v for n, v in self.headers if n == name]


class Client:
    """A raw keep-alive connection that reads answers in order, pipelined or not: one llhttp
    parser for the connection, so answers that arrive in one read are all kept."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.parser = httptools.HttpResponseParser(self)
        self.answers: deque[Answer] = deque()
        self.current = Answer()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self, *, head: bool = False) -> Answer:
        """The next answer; ``head``: the answer to a HEAD request, whose length names a body
        that never comes (read alone, with a parser of its own)."""
        if head:
            assert not self.answers
            return self._head()
        while not self.answers:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the connection")
            self.parser.feed_data(data)
        return self.answers.popleft()

    def _head(self) -> Answer:
        answer = Answer()
        parser = httptools.HttpResponseParser(answer)
        parser.set_dangerous_leniencies(lenient_keep_alive=True)
        data = b""
        while b"\r\n\r\n" not in data:
            read = self.sock.recv(65536)
            if not read:
                raise ConnectionError("the server closed the connection")
            data += read
        assert data.endswith(b"\r\n\r\n"), "bytes after a HEAD answer's head"
        parser.feed_data(data)
        answer.status = parser.get_status_code()
        self.parser = httptools.HttpResponseParser(self)  # the next answer starts afresh
        return answer

    # llhttp's callbacks: one Answer per message

    def on_message_begin(self) -> None:
        self.current = Answer()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current.on_header(name, value)

    def on_headers_complete(self) -> None:
        self.current.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.current.on_body(body)

    def on_message_complete(self) -> None:
        self.current.done = True
        self.answers.append(self.current)

    def closed(self) -> bool:
        self.sock.settimeout(5)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def request(method: str, path: str, key: str | None = None, body: bytes = b"", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: localhost"]
    if key:
        lines.append(f"authorization: Bearer {key}")
    if body or method == "POST":
        lines += ["content-type: application/json", f"content-length: {len(body)}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@pytest.fixture
def cycles(monkeypatch):
    """How many requests the gateway's own server has taken."""
    taken = [0]
    original = http_cycle.Cycle.__init__

    def counting(self, *args, **kwargs):
        taken[0] += 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(http_cycle.Cycle, "__init__", counting)
    return taken


@pytest.fixture
def site_url(settings, transactional_db, monkeypatch):
    """The whole site (portal, REST API, WebSockets, gateway) as ``./slotserve start`` serves it,
    with a gateway of its own (a gateway's connections and locks belong to one event loop)."""
    settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS = 0.05
    from gateway.serve.proxy import Gateway
    from slotserve_site import asgi
    from slotserve_site.asgi import application

    gateway = Gateway()
    monkeypatch.setattr(asgi, "gateway_app", gateway)
    monkeypatch.setattr(application, "gateway", gateway)

    with serving(application) as url:
        yield url


def test_gateway_requests_are_served_here_and_the_rest_by_uvicorn_on_the_same_port(site_url, cycles):
    client = Client(site_url)
    client.send(request("GET", "/v1/models"))
    refused = client.answer()
    assert refused.status == 401 and json.loads(refused.body)["error"]["code"] == "invalid_api_key"
    assert cycles[0] == 1
    # The portal's sign-in page on the same connection: from here on the connection is uvicorn's.
    client.send(request("GET", "/accounts/login/"))
    page = client.answer()
    assert page.status == 200 and page.header(b"content-type")[0].startswith(b"text/html")
    assert b"<form" in page.body
    client.send(request("GET", "/v1/models"))
    again = client.answer()
    assert again.status == 401 and json.loads(again.body)["error"]["code"] == "invalid_api_key"
    assert cycles[0] == 1  # the gateway answered through uvicorn's protocol and the ASGI router
    # A new connection to the gateway is the gateway server's again.
    fresh = Client(site_url)
    fresh.send(request("GET", "/v1/models"))
    assert fresh.answer().status == 401 and cycles[0] == 2


def test_a_portal_request_pipelined_behind_a_gateway_request_gets_the_portal(site_url):
    """Pipelined requests are read here, whatever their path: one for the portal is answered by
    the whole site's application, not by the gateway's 404."""
    client = Client(site_url)
    client.send(
        request("GET", "/v1/models") + request("GET", "/accounts/login/") + request("GET", "/v1/models")
    )
    refused, page, again = client.answer(), client.answer(), client.answer()
    assert refused.status == 401 and json.loads(refused.body)["error"]["code"] == "invalid_api_key"
    assert page.status == 200 and page.header(b"content-type")[0].startswith(b"text/html")
    assert b"<form" in page.body
    assert again.status == 401 and json.loads(again.body)["error"]["code"] == "invalid_api_key"


def test_a_websocket_upgrade_goes_to_uvicorn(site_url, cycles):
    client = Client(site_url)
    client.send(
        request(
            "GET",
            "/ws/overview",
            connection="Upgrade",
            upgrade="websocket",
            sec_websocket_version="13",
            sec_websocket_key="dGhlIHNhbXBsZSBub25jZQ==",
        )
    )
    head = client.sock.recv(65536).split(b"\r\n")[0]
    # uvicorn's WebSocket protocol answered (the consumer accepts or refuses a visitor), not the gateway.
    assert head.split(b" ")[1] in (b"101", b"403"), head
    assert cycles[0] == 0
    client.sock.close()  # the socket's consumer waits for pushes until its client leaves


def test_a_stream_is_chunked_with_one_date_and_server_header_and_the_connection_stays(
    gateway_url, world, cycles
):
    client = Client(gateway_url)
    for _ in range(2):
        client.send(request("POST", "/v1/chat/completions", world.ana_key, STREAM))
        answer = client.answer()
        assert answer.status == 200
        assert answer.header(b"transfer-encoding") == [b"chunked"]
        assert len(answer.header(b"date")) == 1 and len(answer.header(b"server")) == 1
        assert answer.header(b"x-accel-buffering") == [b"no"]
        assert answer.header(b"content-type")[0].startswith(b"text/event-stream")
        events = [e for e in answer.body.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]" and len(events) > 2
        assert b'"usage"' not in answer.body  # asked for by the gateway, hidden from the client
    assert cycles[0] == 2


def test_pipelined_requests_are_answered_in_order_and_head_has_no_body(gateway_url, world):
    client = Client(gateway_url)
    client.send(
        request("POST", "/v1/chat/completions", world.ana_key, CHAT)
        + request("GET", "/v1/models", world.ana_key)
        + request("POST", "/v1/chat/completions", world.bo_key, CHAT)
    )
    first, second, third = client.answer(), client.answer(), client.answer()
    assert first.status == 200 and json.loads(first.body)["object"] == "chat.completion"
    assert second.status == 200 and json.loads(second.body)["object"] == "list"
    assert third.status == 200 and json.loads(third.body)["model"] == "qwen"
    client.send(request("HEAD", "/v1/models", world.ana_key))
    head = client.answer(head=True)
    assert head.status == 200 and head.body == b""
    assert int(head.header(b"content-length")[0]) == len(second.body)
    client.send(request("GET", "/v1/models", world.ana_key))  # nothing of HEAD's body is in the way
    assert json.loads(client.answer().body)["object"] == "list"


@pytest.mark.parametrize("cut", [10, 40, -3])
def test_a_pipelined_request_cut_across_reads_is_still_answered(gateway_url, world, cut):
    """The next request's first bytes come with the one before it and the rest in a later read
    (a request line cut in two, a head cut in two, a body short of its end): the rest goes on
    where the parser stopped, it is not judged as a request of its own."""
    client = Client(gateway_url)
    second = request("POST", "/v1/chat/completions", world.bo_key, CHAT)
    client.send(request("POST", "/v1/chat/completions", world.ana_key, CHAT) + second[:cut])
    first = client.answer()  # the first answer has gone out before the rest arrives
    client.send(second[cut:])
    then = client.answer()
    assert first.status == 200 and json.loads(first.body)["object"] == "chat.completion"
    assert then.status == 200 and json.loads(then.body)["model"] == "qwen"


def test_expect_100_continue_gets_its_go_ahead_before_the_body(gateway_url, world):
    client = Client(gateway_url)
    head = request("POST", "/v1/chat/completions", world.ana_key, CHAT, expect="100-continue")
    client.send(head[: -len(CHAT)])  # the head only, as curl does for a large body
    assert client.sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
    client.send(CHAT)
    answer = client.answer()
    assert answer.status == 200 and json.loads(answer.body)["object"] == "chat.completion"


def test_a_request_that_is_not_http_is_refused_with_400_and_the_connection_closed(gateway_url, world):
    client = Client(gateway_url)
    client.send(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"
    )
    answer = client.answer()
    assert answer.status == 400 and b"Invalid HTTP request" in answer.body
    assert client.closed()


def test_what_can_go_upstream_at_once_is_carried_by_the_fast_lane_and_the_rest_by_the_application(
    settings, transactional_db, world, monkeypatch
):
    settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS = 30  # the first snapshot stays fresh throughout
    from gateway.serve.proxy import Gateway

    carried: list[bool] = []
    take = fast_lane.take

    def recording(gateway, cycle, raw):
        carried.append(take(gateway, cycle, raw))
        return carried[-1]

    monkeypatch.setattr(fast_lane, "take", recording)
    with serving(Gateway()) as url:
        client = Client(url)
        for _ in range(2):  # the first reads the snapshot: the application's; the second goes at once
            client.send(request("POST", "/v1/chat/completions", world.ana_key, STREAM))
            answer = client.answer()
            assert answer.status == 200 and answer.body.rstrip().endswith(b"data: [DONE]")
        # A body that comes in a read after its head (as httpx, and so the openai SDK, send it).
        whole = request("POST", "/v1/chat/completions", world.ana_key, STREAM)
        client.send(whole[: -len(STREAM)])
        time.sleep(0.05)
        client.send(STREAM)
        assert client.answer().status == 200
        # Asking to wait, an unknown key, a body that is not JSON: the application answers.
        client.send(request("POST", "/v1/chat/completions", world.ana_key, STREAM, x_slotserve_wait="5"))
        assert client.answer().status == 200
        client.send(request("POST", "/v1/chat/completions", "sk-nobody", STREAM))
        assert client.answer().status == 401
        client.send(request("POST", "/v1/chat/completions", world.ana_key, b"{not json"))
        assert client.answer().status == 400
        client.send(request("GET", "/v1/models", world.ana_key))  # not a POST: not offered to the lane
        assert client.answer().status == 200
    assert carried == [False, True, True, False, False, False]


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        (b"x" * 300, {}, 413, "request_too_large"),
        (json.dumps({"model": 5}).encode(), {}, 400, "invalid_request"),
        (STREAM, {"x_slotserve_wait": "soon"}, 400, "invalid_request"),
        (json.dumps({"model": "nowhere", "stream": True}).encode(), {}, 404, "model_not_loaded"),
        (json.dumps({"messages": MESSAGES}).encode(), {}, 400, "invalid_request"),
    ],
    ids=["too-large", "model-not-text", "wait-not-a-number", "model-nowhere", "no-model"],
)
def test_the_lane_declines_what_the_application_refuses_and_the_application_refuses_it(
    settings, transactional_db, world, monkeypatch, body, headers, status, code
):
    """Both run the same stages (``gateway.admit.request.asked``, ``gateway.admit.admission``): a request the
    application refuses is never carried by the lane; the application gives the refusal."""
    settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS = 30
    settings.SLOTSERVE_GATEWAY_MAX_BODY_BYTES = 256
    from gateway.serve.proxy import Gateway

    carried: list[bool] = []
    take = fast_lane.take

    def recording(gateway, cycle, raw):
        carried.append(take(gateway, cycle, raw))
        return carried[-1]

    monkeypatch.setattr(fast_lane, "take", recording)
    with serving(Gateway()) as url:
        client = Client(url)
        for _ in range(2):  # the first reads the snapshot; the second finds it fresh
            client.send(request("POST", "/v1/chat/completions", world.ana_key, STREAM))
            assert client.answer().status == 200
        client.send(request("POST", "/v1/chat/completions", world.ana_key, body, **headers))
        answer = client.answer()
    assert (answer.status, json.loads(answer.body)["error"]["code"]) == (status, code)
    assert carried[1] is True and True not in carried[2:]  # a body past the limit is not even offered


def test_a_request_split_across_reads_is_put_together(gateway_url, world):
    client = Client(gateway_url)
    data = request("POST", "/v1/chat/completions", world.ana_key, CHAT)
    for at in range(0, len(data), 7):  # the request line and head arrive in pieces
        client.send(data[at : at + 7])
        time.sleep(0.002)
    answer = client.answer()
    assert answer.status == 200 and json.loads(answer.body)["object"] == "chat.completion"


def test_a_redis_that_forgot_the_scripts_still_counts_requests_in_and_out(gateway_url, world):
    """The count in leaves before the request goes upstream, without a task (``enter_soon``);
    after a Redis restart (its scripts gone) it loads the script and counts again."""
    from channels_app.node_worker.worker import in_flight
    from gateway.wire.counters import key
    from slotserve_base.redis_client import redis_client
    from slotserve_base.vocabulary import RedisKey

    client = Client(gateway_url)
    client.send(request("POST", "/v1/chat/completions", world.ana_key, CHAT))
    assert client.answer().status == 200  # the gateway's Redis connection is open now
    usage = key(RedisKey.USAGE_USER, world.ana.id)

    def counted(requests: int) -> bool:  # counted out (with its usage) and nothing in flight
        return eventually(
            lambda: (
                int(redis_client().hget(usage, "requests") or 0) == requests
                and not in_flight(world.channel.id)
            ),
            timeout=5,
        )

    assert counted(1)
    redis_client().script_flush()
    client.send(request("POST", "/v1/chat/completions", world.ana_key, STREAM))
    answer = client.answer()
    assert answer.status == 200 and answer.body.rstrip().endswith(b"data: [DONE]")
    assert counted(2)


@pytest.fixture
def cors_anywhere(settings):
    settings.SLOTSERVE_CORS_ORIGINS = "*"


def test_a_204_has_neither_length_nor_body(cors_anywhere, gateway_url, world):
    client = Client(gateway_url)
    client.send(
        request(
            "OPTIONS",
            "/v1/chat/completions",
            origin="http://app.example",
            access_control_request_method="POST",
        )
    )
    preflight = client.answer(head=True)
    assert preflight.status == 204 and preflight.body == b""
    assert not preflight.header(b"content-length") and not preflight.header(b"transfer-encoding")
    assert preflight.header(b"access-control-allow-origin")
    client.send(request("GET", "/v1/models", world.ana_key))  # the connection goes on cleanly
    assert json.loads(client.answer().body)["object"] == "list"


def test_uvicorns_concurrency_limit_refuses_gateway_requests_past_it(settings, transactional_db, world):
    """``uvicorn --limit-concurrency`` holds for the gateway's requests too: past it a 503 in
    the caller's API's shape, with Retry-After, and the connection closed (as uvicorn does)."""
    from gateway.serve.proxy import Gateway

    settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS = 0.05
    with serving(Gateway(), limit_concurrency=2) as url:
        busy, other = Client(url), Client(url)  # two connections open: the limit is reached
        connections = SERVING_SERVERS[url].server_state.connections
        assert eventually(lambda: len(connections) == 2)  # both accepted (connected is not yet accepted)
        busy.send(request("POST", "/v1/chat/completions", world.ana_key, CHAT))
        refused = busy.answer()
        assert refused.status == 503 and refused.header(b"retry-after")
        assert json.loads(refused.body)["error"]["code"] == "service_unavailable"
        assert busy.closed()
        other.sock.close()
        assert eventually(lambda: not connections)
        alone = Client(url)
        alone.send(request("POST", "/v1/chat/completions", world.ana_key, CHAT))
        assert alone.answer().status == 200
