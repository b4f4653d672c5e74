"""The ASGI application served by daphne: the portal and REST API over HTTP.

The gateway (OpenAI-compatible proxy) and the live overview's WebSocket join
this router as they are built.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "slotserve_site.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402  (needs Django set up first)

application = ProtocolTypeRouter({"http": django_asgi_app})
