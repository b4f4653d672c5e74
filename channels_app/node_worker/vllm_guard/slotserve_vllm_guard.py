"""An ASGI middleware SlotServe gives vLLM (``--middleware slotserve_vllm_guard.RequireSecret``)
when its sleep mode is on.

vLLM's own ``--api-key`` guards the paths under ``/v1`` only; the endpoints its sleep mode needs
(``/sleep``, ``/wake_up``, ``/is_sleeping``, served with ``VLLM_SERVER_DEV_MODE=1``) and the other
development endpoints that come with them would answer anyone who reaches the port. This asks
the run's secret (``VLLM_API_KEY``) of every request but ``/health``, as SlotServe's other
backends do (docs/security.md). It runs inside vLLM's Python: no import beyond the standard
library."""

from __future__ import annotations

import hmac
import os
from typing import Any

OPEN_PATHS = frozenset({"/health"})
REFUSED = b'{"error": {"message": "Unauthorized", "type": "authentication_error", "code": 401}}'


class RequireSecret:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.expected = f"Bearer {os.environ.get('VLLM_API_KEY', '')}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        sent = dict(scope.get("headers") or []).get(b"authorization", b"")
        if self.expected != b"Bearer " and hmac.compare_digest(sent, self.expected):
            await self.app(scope, receive, send)
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(REFUSED)).encode())]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": REFUSED})
