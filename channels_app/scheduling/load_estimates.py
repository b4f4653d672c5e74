"""The load-time estimate of docs/scheduling.md, as a pure function."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean

RECENT_LOADS = 5
FIRST_LOAD_EXTRA_SECONDS = 15.0
BYTES_PER_MB = 1_000_000  # disk speeds are quoted in decimal megabytes per second


def estimate_load_seconds(
    *, recent_load_seconds: Sequence[float], size_bytes: int, disk_read_mbps: float
) -> float:
    """Seconds a model + preset needs to load on a node.

    ``recent_load_seconds`` are the durations of its successful loads there,
    newest first. After a first success the estimate is the mean of the last
    five; before, the file size read at ``SLOTSERVE_DISK_READ_MBPS`` plus 15 s.
    """
    if recent_load_seconds:
        return fmean(recent_load_seconds[:RECENT_LOADS])
    return size_bytes / (disk_read_mbps * BYTES_PER_MB) + FIRST_LOAD_EXTRA_SECONDS
