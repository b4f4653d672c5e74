"""Where models go (docs/settings.md; docs/scheduling.md): placement's scorers, the booking
limits of a channel that sets none, and loads on demand. Part of ``slotserve_site.settings``,
which imports them all; read with ``slotserve_base.env`` like the rest.
"""

from __future__ import annotations

from slotserve_base.env import env_float, env_int

# Placement scorers' maximums (docs/scheduling.md, like GPUStack's).
SLOTSERVE_SCORE_PLACEMENT_MAX = env_float("SLOTSERVE_SCORE_PLACEMENT_MAX", 100.0)
SLOTSERVE_SCORE_LOCALITY_MAX = env_float("SLOTSERVE_SCORE_LOCALITY_MAX", 5.0)
SLOTSERVE_SCORE_WARM_MAX = env_float("SLOTSERVE_SCORE_WARM_MAX", 5.0)

# Booking limits of a channel that sets none of its own.
SLOTSERVE_DEFAULT_MAX_BOOKING_HOURS = env_float("SLOTSERVE_DEFAULT_MAX_BOOKING_HOURS", 24, minimum=0.25)
SLOTSERVE_DEFAULT_MAX_DAYS_AHEAD = env_int("SLOTSERVE_DEFAULT_MAX_DAYS_AHEAD", 60, minimum=1)

# Loads on demand (docs/scheduling.md, "Loaded on demand").
SLOTSERVE_ON_DEMAND_IDLE_SECONDS = env_float("SLOTSERVE_ON_DEMAND_IDLE_SECONDS", 300, minimum=1)
SLOTSERVE_ON_DEMAND_MIN_STAY_SECONDS = env_float("SLOTSERVE_ON_DEMAND_MIN_STAY_SECONDS", 600)
SLOTSERVE_ON_DEMAND_LOADS_PER_HOUR = env_int("SLOTSERVE_ON_DEMAND_LOADS_PER_HOUR", 4)
