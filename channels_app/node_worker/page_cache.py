"""Reading a model file into the page cache, and evicting it (docs/node-workers.md, "Prewarm from
the calendar"): sequential, throttled, and only while free RAM holds it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHUNK_BYTES = 8 * 2**20
# How often the reader looks at free RAM again.
MEMORY_CHECK_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Read:
    bytes: int
    seconds: float
    complete: bool
    why: str = ""  # why it stopped early

    @property
    def mbps(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def available_bytes(meminfo: str | Path = "/proc/meminfo") -> int:
    """The memory the kernel can give without swapping (``MemAvailable``), in bytes."""
    for line in Path(meminfo).read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"{meminfo} names no MemAvailable")


def read_into_cache(
    path: str | Path,
    *,
    mbps: float,
    reserve_bytes: int,
    stop: Callable[[], bool] = lambda: False,
    free: Callable[[], int] = available_bytes,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Read:
    """Read ``path`` from start to end at no more than ``mbps`` (decimal MB/s; 0: no limit),
    stopping early when ``stop()`` says so or free RAM falls under ``reserve_bytes``."""
    began = clock()
    done = 0
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    checked = 0
    with open(path, "rb", buffering=0) as file:
        os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while True:
            if stop():
                return Read(done, clock() - began, False, "a load began")
            if done - checked >= MEMORY_CHECK_BYTES or done == 0:
                checked = done
                if free() < reserve_bytes:
                    return Read(done, clock() - began, False, "free memory ran short")
            got = file.readinto(view)
            if not got:
                return Read(done, clock() - began, True)
            done += got
            if mbps > 0:
                ahead = done / (mbps * 1e6) - (clock() - began)
                if ahead > 0:
                    sleep(ahead)


def evict(path: str | Path) -> None:
    """Drop the file's clean pages from the page cache (``posix_fadvise(DONTNEED)``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
