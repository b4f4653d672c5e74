"""The gateway's design with none of its work: a second floor for ``gateway_bench.py --bare``.

    uvicorn bare_gateway:application --app-dir bench --http gateway.serve.server:GatewayHttp

The gateway's own HTTP server (``gateway.serve.server``) and upstream client (``gateway.wire.upstream``)
pass each request to one upstream (``SLOTSERVE_BENCH_UPSTREAM``, ``http://host:port``) and its
answer back, chunk by chunk, as the gateway does; but nothing is authenticated, routed, counted
in or out, read for usage or logged. Between the byte relay and SlotServe it splits what the
gateway costs into what its design costs (parsing HTTP on both sides, a task per request) and
what its work costs.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "slotserve_site.settings")
django.setup()

from gateway.serve.proxy import Gateway  # noqa: E402
from gateway.stream.outgoing import HOP_BY_HOP  # noqa: E402
from gateway.wire.upstream import UpstreamTransport  # noqa: E402


class BareGateway(Gateway):
    """A ``Gateway`` (so that ``gateway.serve.server`` serves it) that only passes requests through."""

    lane = False  # every request through the application, as the gateway's were before its lane

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = UpstreamTransport(upstream)

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if scope["method"] != "POST":  # the benchmark's readiness probe
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        reply = await self.upstream.send(
            b"POST", scope["raw_path"], [(b"content-type", b"application/json")], body
        )
        headers = [(name, value) for name, value in reply.headers if name.lower() not in HOP_BY_HOP]
        await send({"type": "http.response.start", "status": reply.status_code, "headers": headers})
        stream = reply.stream
        try:
            async for chunk in stream:
                if not stream.ended:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                else:
                    await send({"type": "http.response.body", "body": chunk})
                    return
            await send({"type": "http.response.body", "body": b""})
        finally:
            await reply.aclose()


application = BareGateway(os.environ["SLOTSERVE_BENCH_UPSTREAM"])
