"""Sending a request on: what goes to the process (the model mapped to its alias, usage asked
for in streams, the run's secret) and which of the process's headers come back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.admit.request import Asked
from gateway.rules.access import ChannelView
from gateway.rules.body import dumps
from gateway.rules.cors import is_cors_header
from gateway.wire.upstream import UpstreamTransport

# Where the gateway asks for usage in streams (to count tokens) when the caller did not: the
# OpenAI routes. llama-server's ``/completion`` and ``/completions`` are its own API, whose
# every event says the tokens so far (``gateway.stream.events``).
USAGE_OPTION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/chat/completions"})


# Headers of the upstream's answer the gateway does not pass on: the connection's own, and
# those the gateway's server sets itself (one ``server``, one ``date``), and CORS (ours).
HOP_BY_HOP = {
    b"server",
    b"date",
    b"x-accel-buffering",
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"content-length",
    b"te",
    b"trailer",
    b"upgrade",
}


def passed_on(upstream_headers: list[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], bool]:
    """The headers of the upstream's answer that go on to the client, and whether the answer is
    a stream of server-sent events."""
    headers, event_stream = [], False
    for name, value in upstream_headers:
        lowered = name.lower()
        if lowered == b"content-type":
            event_stream = value.startswith(b"text/event-stream")
        if lowered not in HOP_BY_HOP and not is_cors_header(lowered):
            headers.append((name, value))
    return headers, event_stream


@dataclass
class Outgoing:
    """What goes to the process: the caller's method, path and query, and the body (the JSON
    object, to be sent with ``model`` mapped, or the raw bytes when it is not JSON)."""

    method: str
    path: str
    query: bytes
    body: dict[str, Any] | None
    raw: bytes
    content_type: bytes

    @classmethod
    def of(cls, request: Asked, method: str, query: bytes) -> Outgoing:
        content_type = request.content_type or b"application/json"
        return cls(method, request.path, query, request.body, request.raw, content_type)

    def to(
        self, channel: ChannelView, upstream: UpstreamTransport
    ) -> tuple[bytes, list[tuple[bytes, bytes]], bytes, bool, bool]:
        """The request as it goes to ``channel``'s process: its target, headers and body
        (``model`` mapped to the channel's; usage asked for in a stream), whether the answer is
        asked to stream, and whether its usage event is the gateway's to hide."""
        body = self.body
        streaming = strip_usage = False
        if body is not None:
            if "model" in body or self.path.startswith("/v1/"):
                body["model"] = channel.model
            streaming = body.get("stream") is True
            if streaming and self.path in USAGE_OPTION_PATHS:
                options = body.get("stream_options")
                if not (isinstance(options, dict) and options.get("include_usage")):
                    # Ask for usage to count tokens, and hide the extra chunk from a client that did not.
                    body["stream_options"] = {
                        **(options if isinstance(options, dict) else {}),
                        "include_usage": True,
                    }
                    strip_usage = True
            content = dumps(body)
        else:
            content = self.raw
        target = upstream.target(self.path)  # quoted once per path; a query is added afresh
        if self.query:
            target += b"?" + self.query
        # The run's secret: the process answers nobody who does not have it (docs/security.md).
        headers = [(b"content-type", self.content_type), (b"authorization", channel.upstream_auth)]
        return target, headers, content, streaming, strip_usage
