"""What a path may carry to a process (docs/security.md, "A process's own endpoints"): the gateway
checks exactly what it forwards. A dot segment, an encoded ``?``, ``#`` or ``%``, a backslash or a
control character is refused 400 before it can be normalised into an admin endpoint; the admin
endpoints are staff's whichever lane a request takes; llama-server's CORS proxy and tools are
never opened by a preset."""

from __future__ import annotations

import json
import socket
from typing import Any
from urllib.parse import urlsplit

import pytest

from channels_app.backends import Backend, effective_args
from tests.conftest import snapshot_seen

pytestmark = pytest.mark.django_db(transaction=True)


def raw(gateway_url: str, method: str, target: str, key: str, body: bytes = b"") -> tuple[int, Any]:
    """One request with ``target`` sent byte for byte (an HTTP client would normalise it); the
    status and the JSON answer."""
    where = urlsplit(gateway_url)
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: {where.netloc}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection((where.hostname, where.port), timeout=10) as conn:
        conn.sendall(head.encode() + body)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    _, _, payload = rest.partition(b"\r\n\r\n")
    try:
        answer = json.loads(payload)
    except ValueError:
        answer = {"raw": payload.decode(errors="replace")}
    return int(status_line.split()[1]), answer


TRICKS = [
    ("GET", "/channels/ch-a/x/../slots"),
    ("GET", "/channels/ch-a/./slots"),
    ("GET", "/channels/ch-a/%2e/slots"),
    ("GET", "/channels/ch-a/%2E%2E/ch-a/slots"),
    ("GET", "/channels/ch-a/slots%3Fa=1"),
    ("GET", "/channels/ch-a/slots%23"),
    ("GET", "/channels/ch-a//slots"),
    ("GET", "/channels/ch-a/x%2F..%2Fslots"),
    ("GET", "/channels/ch-a/%252e%252e/slots"),
    ("GET", "/channels/ch-a/x%5C..%5Cslots"),
    ("POST", "/channels/ch-a/x/../props"),
    ("POST", "/channels/ch-a/x/../slots/0?action=erase"),
    ("POST", "/channels/ch-a/x/../lora-adapters"),
    ("POST", "/v1/x/../../slots/0?action=erase"),
    ("GET", "/channels/ch-a/v1/models%00"),
]


@pytest.mark.parametrize(("method", "target"), TRICKS)
def test_a_path_that_would_be_normalised_is_refused_and_never_reaches_the_process(
    gateway_url, world, method, target
):
    snapshot_seen(gateway_url)
    status, answer = raw(gateway_url, method, target, world.ana_key, b'{"model": "qwen"}')
    assert status == 400, (target, answer)
    assert answer["error"]["code"] == "invalid_request" and "path" in answer["error"]["message"], answer
    logged = world.log.read_text()
    assert "/slots" not in logged and "/props" not in logged and "/lora-adapters" not in logged


def test_a_plain_pinned_path_still_reaches_the_process(gateway_url, world):
    snapshot_seen(gateway_url)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    status, answer = raw(gateway_url, "POST", "/channels/ch-a/v1/chat/completions", world.ana_key, body)
    assert status == 200, answer


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("POST", "/v1/chat/completions/control"),  # ends another caller's reasoning, by its id
        ("POST", "/v1/load_lora_adapter"),  # vLLM's, routed by the body's model
        ("GET", "/channels/ch-a/v1/stream?id=x"),  # resumes another caller's stream
        ("POST", "/channels/ch-a/v1/streams/lookup"),
        ("GET", "/channels/ch-a/cors-proxy?url=http://169.254.169.254/"),
        ("POST", "/channels/ch-a/tools"),
        ("POST", "/channels/ch-a/v1/chat/completions/control"),
    ],
)
def test_endpoints_that_reach_past_the_callers_own_request_are_staffs_on_either_lane(
    gateway_url, world, method, target
):
    snapshot_seen(gateway_url)
    status, answer = raw(gateway_url, method, target, world.ana_key, b'{"model": "qwen", "id": "x"}')
    assert status == 403 and answer["error"]["code"] == "admin_only", (target, answer)
    path = target.split("?")[0].removeprefix("/channels/ch-a")
    assert path not in world.log.read_text()


def test_presets_cannot_open_llama_servers_cors_proxy_or_tools():
    given = [
        "--webui-mcp-proxy",
        "--ui-mcp-proxy",
        "--agent",
        "-ag",
        "--tools",
        "all",
        "--tools-runtime",
        "x",
        "--mcp-servers-config",
        "/etc/mcp.json",
        "--mcp-servers-json",
        "{}",
        "-c",
        "512",
    ]
    assert effective_args(Backend.LLAMA_CPP, given) == ["-c", "512"]
