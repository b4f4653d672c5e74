"""Reading a streamed answer on its way to the client: whole server-sent events, and the token
usage in them (the gateway counts tokens without holding a stream back)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

USAGE_MARK = b'"usage":{'
USAGE_MARK_SPACED = b'"usage": {'


@dataclass
class Usage:
    prompt: int = 0
    completion: int = 0

    def add(self, payload: Any) -> None:
        usage = payload.get("usage") if isinstance(payload, dict) else None
        if isinstance(usage, dict):
            self.prompt = int(usage.get("prompt_tokens") or 0)
            self.completion = int(usage.get("completion_tokens") or 0)


class Events:
    """The server-sent events of a stream, passed on whole: reads ``usage`` on the way, and drops
    the usage-only event the gateway asked for on the client's behalf."""

    # An event is at most this long; beyond it the bytes are passed on as they are.
    LIMIT = 1024 * 1024

    def __init__(self, usage: Usage, strip_usage: bool) -> None:
        self.usage = usage
        self.strip_usage = strip_usage
        self.pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """The complete events received so far; a part event waits for the rest of it."""
        if self.pending:
            chunk = self.pending + chunk
            self.pending = b""
        lf, crlf = chunk.rfind(b"\n\n"), chunk.rfind(b"\r\n\r\n")
        cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)  # past the last whole event
        if cut < len(chunk):
            if cut == 0 and len(chunk) > self.LIMIT:
                return chunk
            self.pending = chunk[cut:]
            chunk = chunk[:cut]
        if USAGE_MARK in chunk or USAGE_MARK_SPACED in chunk:
            chunk = _take_usage(chunk, self.usage, self.strip_usage)
        return chunk

    def flush(self) -> bytes:
        rest, self.pending = self.pending, b""
        return rest


def _take_usage(chunk: bytes, usage: Usage, strip: bool) -> bytes:
    """Read ``usage`` from the SSE events in ``chunk``; drop the usage-only event if asked."""
    kept = []
    for event in chunk.split(b"\n\n"):
        if event.startswith(b"data: {") and (USAGE_MARK in event or USAGE_MARK_SPACED in event):
            try:
                payload = json.loads(event[6:])
            except ValueError:
                kept.append(event)
                continue
            usage.add(payload)
            if strip and not payload.get("choices"):
                continue
        kept.append(event)
    return b"\n\n".join(kept)
