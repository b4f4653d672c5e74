"""Reading a streamed answer on its way to the client: whole server-sent events, and the token
usage in them (the gateway counts tokens without holding a stream back)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gateway.rules.body import dumps, loads

USAGE_MARK = b'"usage":{'
USAGE_MARK_SPACED = b'"usage": {'
NATIVE_MARK, SGLANG_MARK = b'"tokens_predicted":', b'"meta_info":'


# The fields a request limits its answer's tokens with, by API: OpenAI's Chat Completions (both)
# and Responses, llama-server's own, SGLang's and Hugging Face's (Anthropic's is max_tokens).
ASKED_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens", "n_predict", "max_new_tokens")


@dataclass
class Usage:
    prompt: int = 0
    completion: int = 0
    asked: int = 0  # the tokens the request allowed its answer, charged if its usage is unread
    read: bool = False  # whether the answer said what it used, all of it
    sent: int = 0  # the events of a stream passed on to the client (each about a token)

    @classmethod
    def asking(cls, body: Any) -> Usage:
        """The usage of a request with ``body`` (its JSON, or None), before any is read."""
        asked = 0
        if isinstance(body, dict):
            options = body.get("sampling_params")  # SGLang's /generate
            for source in (body, options if isinstance(options, dict) else {}):
                for field in ASKED_FIELDS:
                    value = source.get(field)
                    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                        asked = value
                        break
                if asked:
                    break
        return cls(asked=asked)

    def add(self, payload: Any) -> None:
        """Read the token counts of an answer or event: OpenAI's ``prompt_tokens`` and
        ``completion_tokens``, or the Responses and Anthropic APIs' ``input_tokens`` and
        ``output_tokens`` (also inside their ``response`` or ``message`` object); llama-server's
        own ``tokens_evaluated`` and ``tokens_predicted``; SGLang's ``meta_info``."""
        if not isinstance(payload, dict):
            return
        usage = payload.get("usage")
        if not isinstance(usage, dict):
            inner = payload.get("response") or payload.get("message")
            usage = inner.get("usage") if isinstance(inner, dict) else None
        if not isinstance(usage, dict):
            if "tokens_predicted" in payload:
                usage = {
                    "prompt_tokens": payload.get("tokens_evaluated"),
                    "completion_tokens": payload["tokens_predicted"],
                }
            elif isinstance(payload.get("meta_info"), dict):
                usage = payload["meta_info"]
            else:
                return
        prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
        completion = usage.get("completion_tokens", usage.get("output_tokens"))
        # Anthropic's input_tokens leave out the prompt read from or written to its cache, which
        # the other APIs' prompt_tokens include: counted the same way on every route.
        for cached in ("cache_read_input_tokens", "cache_creation_input_tokens"):
            extra = usage.get(cached)
            if isinstance(prompt, int) and isinstance(extra, int):
                prompt += extra
        # A Messages stream's message_start tells the prompt and a first output count; the
        # message_delta events that follow tell the output so far: only those say it all.
        final = payload.get("type") != "message_start"
        if isinstance(prompt, int):
            self.prompt = prompt
            self.read = self.read or final
        if isinstance(completion, int):
            self.completion = completion
            self.read = self.read or final

    def settle(self, status: int | None) -> Usage:
        """At the answer's end: an answer that went through (2xx) but never said all of its
        tokens (a route whose answers SlotServe cannot read, a stream its caller hung up on
        before its usage came) is charged what its request allowed, or the events it was sent
        if that is more (a request that set no limit), so a token budget holds on every route
        (docs/security.md)."""
        if not self.read and status is not None and 200 <= status < 300:
            self.completion = max(self.completion, self.asked, self.sent)
        return self

    def settled(self) -> Usage:
        return self.settle(200)


FINISH_MARK, FINISH_MARK_SPACED = b'"finish_reason":"', b'"finish_reason": "'
# Any of the four marks, found in one pass.
MARKED = re.compile(rb'"usage": ?\{|"finish_reason": ?"')


class Events:
    """The server-sent events of a stream, passed on whole: reads ``usage`` on the way, and drops
    the usage-only event the gateway asked for on the client's behalf.

    llama-server puts its ``timings`` in the last event; asked for usage, it moves them into the
    usage-only event. So while the gateway strips that event, it holds the event that finishes
    a choice until it sees what follows, and moves the timings back into it: the client gets
    the stream it would have had without the gateway."""

    # An event is at most this long; beyond it the bytes are passed on as they are.
    LIMIT = 1024 * 1024

    def __init__(self, usage: Usage, strip_usage: bool) -> None:
        self.usage = usage
        self.strip_usage = strip_usage
        self.pending = b""
        self.held: bytes | None = None  # a finishing event, while stripping (see above)

    def feed(self, chunk: bytes) -> bytes:
        """The complete events received so far; a part event waits for the rest of it."""
        passed = self._whole(chunk)
        self.usage.sent += passed.count(b"data: {")
        return passed

    def _whole(self, chunk: bytes) -> bytes:
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
        if self.strip_usage:
            if self.held is not None:
                return self._strip(chunk, 0)
            marked = MARKED.search(chunk)
            return chunk if marked is None else self._strip(chunk, marked.start())
        if _has_usage(chunk):
            chunk = _take_usage(chunk, self.usage, strip=False)
        return chunk

    def flush(self) -> bytes:
        rest, self.pending = self.pending, b""
        if self.held is not None:
            rest, self.held = self.held + b"\n\n" + rest, None
        self.usage.sent += rest.count(b"data: {")
        return rest

    def _strip(self, chunk: bytes, first_mark: int) -> bytes:
        """Event by event from the one ``first_mark`` is in: read and drop the usage-only event,
        holding a finishing event until the next one (to give it the usage event's timings)."""
        passed = b""
        if self.held is None:  # the events before the first that has a mark go on as they are
            cut = chunk.rfind(b"\n\n", 0, first_mark) + 2
            if cut > 1:
                passed, chunk = chunk[:cut], chunk[cut:]
        out = []
        for event in chunk.split(b"\n\n"):
            if not event:
                continue
            payload = _payload(event) if USAGE_MARK in event or USAGE_MARK_SPACED in event else None
            if isinstance(payload, dict) and "usage" in payload:
                self.usage.add(payload)
                if not payload.get("choices"):
                    timings = payload.get("timings")
                    if self.held is not None:
                        out.append(_with_timings(self.held, timings) if timings else self.held)
                        self.held = None
                    continue
            if self.held is not None:
                out.append(self.held)
                self.held = None
            if FINISH_MARK in event or FINISH_MARK_SPACED in event:
                self.held = event
            else:
                out.append(event)
        return passed + (b"\n\n".join(out) + b"\n\n" if out else b"")


def _has_usage(data: bytes) -> bool:
    return (
        USAGE_MARK in data
        or USAGE_MARK_SPACED in data
        or NATIVE_MARK in data  # llama-server's own routes: every event counts so far
        or SGLANG_MARK in data
    )


def _payload(event: bytes) -> Any:
    """The JSON of an event's ``data:`` line (SSE events may start with an ``event:`` line)."""
    start = event.find(b"data: {")
    if start < 0:
        return None
    try:
        return loads(event[start + 6 :])
    except ValueError:
        return None


def _with_timings(event: bytes, timings: Any) -> bytes:
    payload = _payload(event)
    if not isinstance(payload, dict):
        return event
    payload["timings"] = timings
    start = event.find(b"data: {")
    return event[:start] + b"data: " + dumps(payload)


def _take_usage(chunk: bytes, usage: Usage, strip: bool) -> bytes:
    """Read ``usage`` from the SSE events in ``chunk``; drop the usage-only event if asked."""
    kept = []
    for event in chunk.split(b"\n\n"):
        if b"data: {" in event and _has_usage(event):
            payload = _payload(event)
            if payload is None:
                kept.append(event)
                continue
            usage.add(payload)
            if strip and not payload.get("choices"):
                continue
        kept.append(event)
    return b"\n\n".join(kept)
