"""Which of a connection's requests the gateway's own server keeps (``gateway.serve.server``) and
which go to uvicorn with the rest of the connection: the gateway's paths, judged at a request's
first bytes; and where the gateway is in the site's ASGI application."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from gateway.admit.request import is_gateway_path
from gateway.serve.proxy import Gateway

# A request head this long without its end is left to uvicorn (which refuses what is too long).
MAX_HEAD = 16 * 1024


def find_gateway(app: Any) -> Gateway | None:
    """The ``Gateway`` in an ASGI application: the app itself, its ``gateway`` attribute, or
    either of an app it wraps (``.app``, as uvicorn's middleware do)."""
    for _ in range(8):
        if isinstance(app, Gateway):
            return app
        found = getattr(app, "gateway", None)
        if isinstance(found, Gateway):
            return found
        app = getattr(app, "app", None)
        if app is None:
            return None
    return None


def judge(data: bytes) -> bool | None:
    """Whether the request that ``data`` begins is the gateway's to serve here (True), uvicorn's
    (False), or cannot be told yet (None: its head is not all there)."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return False if len(data) > MAX_HEAD else None
    line_end = data.find(b"\r\n")
    parts = data[:line_end].split(b" ")
    if len(parts) != 3 or not parts[1].startswith(b"/"):
        return False
    head = data[line_end:end].lower()
    if b"\nupgrade:" in head:
        return False
    try:
        path = unquote(parts[1].partition(b"?")[0].decode("ascii"))
    except UnicodeDecodeError:
        return False
    return is_gateway_path(path)
