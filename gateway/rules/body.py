"""The request body the gateway accepts: one JSON object, with ``model``, ``stream`` and
``stream_options`` of the types the backends expect."""

from __future__ import annotations

import json
from typing import Any

import orjson

from slotserve_base.json_text import MAX_DEPTH, TOO_DEEP, BadText, check_text


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
        return None, TOO_DEEP
    except BadText as exc:
        return None, str(exc)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, f"the body is not valid JSON: {exc}"
    if not isinstance(body, dict):
        return None, "the body must be a JSON object"
    if "model" in body and not isinstance(body["model"], str):
        return None, "model must be a string"
    if "model" in body and not body["model"].isprintable():
        return None, "model must be printable text (no control characters)"
    if "stream" in body and not isinstance(body["stream"], bool):
        return None, "stream must be a boolean (true or false)"
    if body.get("stream_options") is not None and not isinstance(body["stream_options"], dict):
        return None, "stream_options must be an object"
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:  # only then can it be that deep
        try:
            check_text(body, strings=False)
        except BadText as exc:
            return None, str(exc)
    return body, ""


def loads(data: bytes) -> Any:
    """JSON from bytes, by orjson (C); what orjson refuses but Python's json reads (an integer
    past 64 bits, NaN) is read by json, so the gateway accepts what it accepted before. What
    orjson refuses for good reason is refused here too (``BadText``): nesting past its limit,
    and strings that are not Unicode (a lone surrogate such as ``\\ud800``, which Python's json
    reads but no database stores and no UTF-8 encoder writes)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "recursion" in str(exc).lower():
            raise RecursionError(str(exc)) from None
    value = json.loads(data)
    check_text(value, strings=True)
    return value


def dumps(value: Any) -> bytes:
    """Compact JSON bytes, by orjson; by json where orjson cannot (an integer past 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()
