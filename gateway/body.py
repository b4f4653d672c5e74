"""The request body the gateway accepts: one JSON object, with ``model``, ``stream`` and
``stream_options`` of the types the backends expect."""

from __future__ import annotations

import json
from typing import Any

import orjson


class BodyTooLarge(Exception):
    """The request body is past ``SLOTSERVE_GATEWAY_MAX_BODY_BYTES``."""


def parse_body(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """The request's JSON object, or None and what is wrong with it, in words for the caller.

    ``stream`` must be a real boolean: a string "true" would stream from the backend while
    the gateway read the answer as one JSON body, and count no tokens.
    """
    if not raw.strip():
        return None, "the request body is empty: send a JSON object"
    try:
        body = loads(raw)
    except RecursionError:
        return None, "the JSON body is nested too deeply"
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, f"the body is not valid JSON: {exc}"
    if not isinstance(body, dict):
        return None, "the body must be a JSON object"
    if "model" in body and not isinstance(body["model"], str):
        return None, "model must be a string"
    if "stream" in body and not isinstance(body["stream"], bool):
        return None, "stream must be a boolean (true or false)"
    if body.get("stream_options") is not None and not isinstance(body["stream_options"], dict):
        return None, "stream_options must be an object"
    return body, ""


def loads(data: bytes) -> Any:
    """JSON from bytes, by orjson (C); what orjson refuses but Python's json reads (an integer
    past 64 bits, NaN) is read by json, so the gateway accepts what it accepted before."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps(value: Any) -> bytes:
    """Compact JSON bytes, by orjson; by json where orjson cannot (an integer past 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()
