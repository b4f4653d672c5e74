"""The gateway's settings (docs/settings.md; docs/gateway.md): how long it refreshes and holds,
what it limits per user, its fair queue, and how much it takes at once. Part of
``slotserve_site.settings``, which imports them all; read with ``slotserve_base.env`` like the rest.
"""

from __future__ import annotations

from slotserve_base.env import env_bool, env_float, env_int, env_list

# The gateway.
SLOTSERVE_GATEWAY_REFRESH_SECONDS = env_float("SLOTSERVE_GATEWAY_REFRESH_SECONDS", 1.0, minimum=0.05)
# The longest a caller may ask the gateway to hold a request (X-SlotServe-Wait, a key's default).
SLOTSERVE_GATEWAY_MAX_WAIT_SECONDS = env_int("SLOTSERVE_GATEWAY_MAX_WAIT_SECONDS", 600, minimum=0)
# Fair sharing outside slots, per user (0: no limit; per-user overrides in the admin, "Sharing
# limits"; a booker in their own slot is never limited).
SLOTSERVE_LIMIT_CONCURRENT_REQUESTS = env_int("SLOTSERVE_LIMIT_CONCURRENT_REQUESTS", 0, minimum=0)
SLOTSERVE_LIMIT_REQUESTS_PER_MINUTE = env_int("SLOTSERVE_LIMIT_REQUESTS_PER_MINUTE", 0, minimum=0)
SLOTSERVE_LIMIT_WEEKLY_TOKENS = env_int("SLOTSERVE_LIMIT_WEEKLY_TOKENS", 0, minimum=0)
# Browser origins that may call the gateway (CORS): comma-separated, "*" for any; none by default.
SLOTSERVE_CORS_ORIGINS = env_list("SLOTSERVE_CORS_ORIGINS", [])
# Connections and requests the web server takes at once (`manage.py run`); past it, a 503.
SLOTSERVE_GATEWAY_MAX_CONNECTIONS = env_int("SLOTSERVE_GATEWAY_MAX_CONNECTIONS", 2000, minimum=10)
# Requests one user may have held at once (X-SlotServe-Wait), all gateway processes together;
# a user with a concurrency limit of their own may hold at most that many. Past it, a 429.
SLOTSERVE_GATEWAY_MAX_HELD_PER_USER = env_int("SLOTSERVE_GATEWAY_MAX_HELD_PER_USER", 16, minimum=1)
# The fair queue of each channel whose process's places are known (docs/gateway.md, "Fair
# sharing under contention"): on, and how many requests may wait, per user and per channel.
SLOTSERVE_FAIR_QUEUE = env_bool("SLOTSERVE_FAIR_QUEUE", True)
SLOTSERVE_QUEUE_PER_USER = env_int("SLOTSERVE_QUEUE_PER_USER", 64, minimum=1)
SLOTSERVE_QUEUE_PER_CHANNEL = env_int("SLOTSERVE_QUEUE_PER_CHANNEL", 512, minimum=1)
SLOTSERVE_GATEWAY_MAX_BODY_BYTES = env_int("SLOTSERVE_GATEWAY_MAX_BODY_BYTES", 10 * 1024 * 1024, minimum=1024)
