"""SlotServe with the gateway's fast lane switched off: ``gateway_bench.py --no-lane``.

    uvicorn application_gateway:application --app-dir bench --http gateway.serve.server:GatewayHttp

Every gateway request is answered by the gateway's ASGI application (``gateway.serve.proxy``) in a task
of its own, as before the fast lane (``gateway.serve.fast_lane``): measured beside SlotServe in the same run,
it shows what the lane saves.
"""

from __future__ import annotations

from slotserve_site.asgi import application, gateway_app

gateway_app.lane = False

__all__ = ["application"]
