"""Who is calling and what they ask: the gateway's paths, the caller's key, the pinned channel,
how long they will wait. The first stage of every request, in the fast lane and the application."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from gateway.admit.snapshot import Snapshot
from gateway.rules.access import Refusal
from gateway.rules.body import parse_body
from gateway.rules.callers import Caller
from gateway.types import Scope
from slotserve_base.vocabulary import ErrorCode

# Paths outside /v1/ that llama-server answers and the gateway routes by ``model``.
ROOT_PATHS = frozenset(
    {
        "/completion",
        "/completions",
        "/embedding",
        "/embeddings",
        "/infill",
        "/tokenize",
        "/detokenize",
        "/apply-template",
        "/rerank",
        "/reranking",
    }
)


# A process's admin endpoints (llama-server, vLLM, SGLang): through the pinned path, staff
# only. What they do reaches past the caller's own request: another caller's slot state saved
# or restored, and in shared time the previous caller's sampling settings shown (``/slots``),
# the process's settings or adapters changed, caches flushed, weights swapped, the process put
# to sleep (docs/security.md). Reading ``/props`` stays open: it changes nothing.
ADMIN_PATHS = frozenset(
    {
        "/props",
        "/lora-adapters",
        "/reset_prefix_cache",
        "/sleep",
        "/wake_up",
        "/collective_rpc",
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/load_lora_adapter",
        "/unload_lora_adapter",
        "/flush_cache",
        "/update_weights_from_disk",
        "/update_weights_from_tensor",
        "/update_weights_from_distributed",
        "/init_weights_update_group",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/start_profile",
        "/stop_profile",
        "/configure_logging",
        "/set_internal_state",
        "/abort_request",
        "/pause",
        "/resume",
        "/models",
        "/models/load",
        "/models/unload",
    }
)

# Endpoints that reach past the caller's own request whatever the method, with what is under
# them: slots (another caller's state), llama-server's CORS proxy (any address the node reaches)
# and server-side tools, another completion's controls (by its id) and resumable streams
# (another caller's answer, by its id).
ADMIN_TREES = (
    "/slots",
    "/cors-proxy",
    "/tools",
    "/v1/chat/completions/control",
    "/v1/stream",
    "/v1/streams",
)


def is_admin_endpoint(method: str, path: str) -> bool:
    """Whether ``method path`` (a process's own path, after ``/channels/<name>`` or on the routed
    lane) is one of its admin endpoints: those of ``ADMIN_TREES`` whatever the method, the others
    but for reading."""
    bare = path.rstrip("/") or "/"
    if any(bare == tree or bare.startswith(tree + "/") for tree in ADMIN_TREES):
        return True
    return method not in ("GET", "HEAD") and bare in ADMIN_PATHS


# Anything ``path_problem`` names: a control character, ?, #, %, a backslash, //, a . or .. segment.
SUSPECT_PATH = re.compile(r"[\x00-\x1f\x7f?#%\\]|//|/\.\.?(?:/|$)")


def path_problem(path: str) -> str | None:
    """Why the gateway refuses ``path`` (the decoded path it would forward), or None.

    The gateway forwards exactly the path it checked. A URL join would remove dot segments and
    cut at ``?`` and ``#``, and the process decodes what is still encoded, so a path that
    would change on the way (``/x/../slots``, ``slots%3Fa``, ``%252e``, ``//slots``) is refused
    rather than normalised: no such path names an endpoint a caller needs."""
    if SUSPECT_PATH.search(path) is None:  # every request asks: one scan in C for the usual path
        return None
    if any(ord(c) < 0x20 or c == "\x7f" for c in path):
        return "a control character"
    for character, words in (
        ("?", "an encoded ?"),
        ("#", "an encoded #"),
        ("%", "an encoded %"),
        ("\\", "a \\"),
    ):
        if character in path:
            return words
    segments = path.split("/")[1:]
    if any(segment in (".", "..") for segment in segments):
        return "a . or .. segment"
    if "" in segments[:-1]:
        return "an empty segment (//)"
    return None


def is_gateway_path(path: str) -> bool:
    """Whether the ASGI router sends ``path`` here rather than to Django."""
    return path.startswith(("/v1/", "/channels/")) or path in ROOT_PATHS


def flavour_of(path: str) -> str:
    """The API whose shape the answers to ``path`` take: Anthropic's for its Messages API."""
    return "anthropic" if "/v1/messages" in path else "openai"


def authenticate(scope: Scope, snapshot: Snapshot) -> Caller | None:
    """The caller whose API key is in ``Authorization: Bearer <key>`` (OpenAI's clients) or in
    ``x-api-key`` (Anthropic's), if it is usable."""
    key = ""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, given = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                key = given.strip()
                break
        elif name == b"x-api-key":
            key = value.decode("latin-1").strip()
    if not key:
        return None
    return snapshot.callers.get(hashlib.sha256(key.encode()).hexdigest())


def split_path(path: str) -> tuple[str | None, str]:
    """``/channels/a100-0/v1/models`` → (``a100-0``, ``/v1/models``)."""
    if path.startswith("/channels/"):
        name, _, rest = path[len("/channels/") :].partition("/")
        return name, "/" + rest
    return None, path


def wait_seconds(scope: Scope, caller: Caller, most: float) -> tuple[float, str]:
    """How long to hold this request if its model is not ready: ``X-SlotServe-Wait`` (seconds),
    else the key's default; at most ``SLOTSERVE_GATEWAY_MAX_WAIT_SECONDS``. And what is wrong
    with the header, if anything."""
    given = header(scope, b"x-slotserve-wait")
    if not given:
        return min(caller.wait_seconds, most), ""
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        return (
            0.0,
            f"X-SlotServe-Wait must be a number of seconds (0 or more), not {given.decode('latin-1')!r}",
        )
    return min(seconds, most), ""


def header(scope: Scope, name: bytes) -> bytes:
    return next((v for k, v in scope["headers"] if k == name), b"")


@dataclass(frozen=True, slots=True)
class Asked:
    """A request as the gateway routes it: who calls, what they ask, how long they will wait."""

    caller: Caller
    pinned: str | None  # the channel named in the path (``/channels/<name>/…``), if any
    path: str  # the path the process sees
    body: dict[str, Any] | None  # None: a pinned request's body that is not JSON, sent as it is
    raw: bytes
    content_type: bytes
    named: str  # the model as the client named it ("" for none): the request log's
    model: str | None  # what it is routed by: an alias is routed as its model
    wait: float  # seconds to hold it while its model is not ready


def asked(
    scope: Scope,
    raw: bytes,
    caller: Caller,
    snapshot: Snapshot,
    *,
    pinned: str | None,
    path: str,
    max_body: int,
    max_wait: float,
) -> Asked | Refusal:
    """What ``caller`` asks in this request (``raw``: its whole body), or why it is refused
    before any channel is looked at. The fast lane and the application both begin here; the
    lane leaves a refusal to the application, which gives it."""
    if len(raw) > max_body:
        return too_large(max_body)
    content_type = header(scope, b"content-type")
    body: dict[str, Any] | None = None
    # Routed by model: a JSON object. Pinned: JSON when it says or looks so, else any bytes.
    if pinned is None or (
        (content_type.startswith(b"application/json") or raw.lstrip().startswith(b"{")) and raw.strip()
    ):
        body, problem = parse_body(raw)
        if body is None:
            return Refusal(400, ErrorCode.INVALID_REQUEST, problem)
    wait, problem = wait_seconds(scope, caller, max_wait)
    if problem:
        return Refusal(400, ErrorCode.INVALID_REQUEST, problem)
    named = body.get("model") if body is not None else None
    model = snapshot.aliases.get(named, named) if named is not None else None
    return Asked(caller, pinned, path, body, raw, content_type, named or "", model, wait)


def too_large(max_body: int) -> Refusal:
    """A body past ``SLOTSERVE_GATEWAY_MAX_BODY_BYTES``: refused as soon as it is known."""
    return Refusal(413, ErrorCode.REQUEST_TOO_LARGE, f"the request body is larger than {max_body} bytes")
