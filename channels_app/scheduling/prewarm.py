"""Which model file a node reads into its page cache ahead of its next booking (docs/node-workers.md,
"Prewarm from the calendar"), as a pure function."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from slotserve_base.target import Target


@dataclass(frozen=True)
class Upcoming:
    """A channel's next approved booking of a model, with the file its load will read."""

    channel_id: int
    booking_id: int
    start: datetime
    target: Target
    path: str
    size_bytes: int
    # What the channel runs now and what the scheduler wants of it.
    running: Target | None = None
    decided: Target | None = None

    @property
    def key(self) -> str:
        """Once per booking and file: a file read for a booking is not read again for it."""
        return f"{self.booking_id}:{self.path}"


def choose(
    upcoming: Sequence[Upcoming],
    *,
    now: datetime,
    horizon: timedelta,
    loading: bool,
    available_bytes: int,
    reserve_bytes: int,
    done: Collection[str],
) -> Upcoming | None:
    """The booking whose file to read now, the soonest first, or None.

    Nothing while a load runs on the node (a prewarm never competes with one); nothing for a
    booking further off than ``horizon`` or already begun, one whose model already runs or whose
    preload has begun (the scheduler decided it), one read already, or a file that free RAM would
    not hold with ``reserve_bytes`` to spare.
    """
    if loading:
        return None
    for booking in sorted(upcoming, key=lambda u: (u.start, u.channel_id)):
        if not now < booking.start <= now + horizon or booking.key in done:
            continue
        if booking.target in (booking.running, booking.decided):
            continue
        if booking.size_bytes + reserve_bytes > available_bytes:
            continue
        return booking
    return None
