"""Time in the tests: the one moment they happen at, and waiting for another component.

``T0`` is a Monday, 08:00 UTC (09:00 in Berlin, 16:00 in Shanghai); a test module that needs
another hour names it from ``T0``. ``eventually`` is the one way to wait for something another
process or thread does: it looks again until the predicate holds or the time is up, and never
sleeps longer than it must. ``throughout`` is its mirror, for what must not happen: the tests
sleep in no other way to wait for another component.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

T0 = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
# The portal's pages are read at 13:00 in Shanghai (05:00 UTC), a booking under way.
PORTAL_T0 = datetime(2026, 12, 7, 5, 0, tzinfo=UTC)


def eventually(predicate: Callable[[], object], timeout: float = 10.0, every: float = 0.02) -> bool:
    """Whether ``predicate`` holds within ``timeout`` seconds, looking every ``every`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)


def throughout(predicate: Callable[[], object], seconds: float, every: float = 0.02) -> bool:
    """Whether ``predicate`` holds at every look for ``seconds``: that something does *not*
    happen (a refused request never reaches the process, a held one is never sent). Such a check
    can only be made over a time; it says which time, and fails at the first look that breaks it."""
    deadline = time.monotonic() + seconds
    while True:
        if not predicate():
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(every)
