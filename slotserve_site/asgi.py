"""The ASGI application served by daphne (or uvicorn): the portal and REST API
through Django, and the OpenAI-compatible gateway (``/v1/…`` and
``/channels/<name>/v1/…``) as its own small ASGI app, off Django's request path."""

import gc
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.core.asgi import get_asgi_application

from slotserve_base import tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "slotserve_site.settings")
# Traces only where OTEL_EXPORTER_OTLP_ENDPOINT asks for them (docs/metrics.md, "Traces"); Django's
# are set up before it loads its middleware.
TRACED = tracing.start_web()
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path  # noqa: E402

from gateway.admit.request import is_gateway_path  # noqa: E402
from gateway.serve.proxy import Gateway  # noqa: E402
from portal.live import OverviewConsumer  # noqa: E402
from slotserve_site.warm import warm_up  # noqa: E402

gateway_app = Gateway()
if TRACED:
    from gateway.stream.traces import turn_on

    turn_on()

Scope = MutableMapping[str, Any]


async def http_router(
    scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
) -> None:
    if is_gateway_path(scope["path"]):
        await gateway_app(scope, receive, send)
    else:
        await django_asgi_app(dict(scope), receive, send)


application = ProtocolTypeRouter(
    {
        "http": http_router,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter([path("ws/overview", OverviewConsumer.as_asgi())]))
        ),
    }
)

# gateway.serve.server.GatewayHttp (uvicorn --http) serves the gateway's requests itself: it finds it here.
application.gateway = gateway_app

# Every view imported and every template compiled now, not by the first request (slotserve_site.warm).
warm_up()
# What start-up made lives as long as the process: out of the garbage collector's sight, a full
# collection under load takes a few milliseconds instead of a hundred.
gc.freeze()
# A streamed request allocates a few hundred objects, nearly all gone when it ends: the young
# generation is collected every 20,000 allocations instead of 700 (about 15 % less CPU per
# request on the gateway benchmark), older generations as rarely.
gc.set_threshold(20_000, 50, 100)
