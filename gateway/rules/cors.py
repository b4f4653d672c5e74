"""Cross-origin calls from browsers (CORS), for web apps that call the gateway with a key.

Allowed origins come from ``SLOTSERVE_CORS_ORIGINS`` (comma-separated, ``*`` for any). A
preflight (``OPTIONS`` with ``Access-Control-Request-Method``) is answered here, before any
key is asked for, as browsers send none with it; every other answer gets
``Access-Control-Allow-Origin`` for an allowed origin. The inference processes' own CORS
headers never reach the client: the gateway decides.
"""

from __future__ import annotations

from collections.abc import Iterable

ALLOWED_METHODS = b"GET, HEAD, POST, OPTIONS"
DEFAULT_HEADERS = b"authorization, content-type, x-api-key, anthropic-version, x-slotserve-wait"
# What a page's script may read of an answer besides the simple headers.
EXPOSED = b"retry-after, x-request-id"
MAX_AGE = b"600"


class CorsPolicy:
    def __init__(self, origins: Iterable[str]) -> None:
        cleaned = [o.strip().rstrip("/") for o in origins if o.strip()]
        self.any = "*" in cleaned
        self.origins = {o.encode() for o in cleaned if o != "*"}

    @property
    def enabled(self) -> bool:
        return self.any or bool(self.origins)

    def allows(self, origin: bytes) -> bool:
        return self.any or origin.rstrip(b"/") in self.origins

    def answer_headers(self, origin: bytes) -> list[tuple[bytes, bytes]]:
        """Added to every answer to an allowed origin."""
        return [
            (b"access-control-allow-origin", b"*" if self.any else origin),
            (b"access-control-expose-headers", EXPOSED),
            (b"vary", b"origin"),
        ]

    def preflight_headers(self, origin: bytes, requested_headers: bytes) -> list[tuple[bytes, bytes]]:
        if not self.allows(origin):
            return [(b"vary", b"origin")]
        return [
            *self.answer_headers(origin),
            (b"access-control-allow-methods", ALLOWED_METHODS),
            (b"access-control-allow-headers", requested_headers or DEFAULT_HEADERS),
            (b"access-control-max-age", MAX_AGE),
        ]


def is_cors_header(name: bytes) -> bool:
    return name.lower().startswith(b"access-control-")
