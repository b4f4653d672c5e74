"""The node's GPUs: NVIDIA's through NVML, or fake ones for machines without them."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

_UNITS = {
    "": 1,
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
}
_FAKE = re.compile(r"^\s*(\d+)\s*x\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_warned_no_nvml = False


class FakeGpuSpecError(ValueError):
    pass


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_bytes: int
    free_bytes: int


def host_ram_bytes() -> int | None:
    """The machine's physical memory (placement's RAM term), or None where the system won't say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def parse_fake_gpus(spec: str) -> list[GpuInfo]:
    """``SLOTSERVE_FAKE_GPUS``: ``2x24GiB``, or several groups ``1x80GiB,1x24GiB``."""
    gpus: list[GpuInfo] = []
    for part in spec.split(","):
        match = _FAKE.match(part)
        if match is None or match.group(3).lower() not in _UNITS:
            raise FakeGpuSpecError(f"SLOTSERVE_FAKE_GPUS={spec!r}: write it like 2x24GiB or 1x80GiB,1x24GiB")
        count, size, unit = int(match.group(1)), float(match.group(2)), match.group(3).lower()
        memory = int(size * _UNITS[unit])
        for _ in range(count):
            gpus.append(GpuInfo(len(gpus), "Fake GPU", memory, memory))
    return gpus


class NvmlUnavailable(Exception):
    """NVML cannot be asked: no driver, no library, or it failed; the message is NVML's reason."""


@contextmanager
def nvml() -> Iterator[Any]:
    """NVML, started for the block and shut down after; ``NvmlUnavailable`` when it cannot be
    asked (no library, no driver)."""
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable("nvidia-ml-py is not installed") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(str(exc)) from exc
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def nvml_gpus() -> list[GpuInfo]:
    """The NVIDIA GPUs NVML reports, with their memory free now (memory other programs hold is
    not free); ``NvmlUnavailable`` when NVML cannot be asked."""
    with nvml() as pynvml:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            found.append(
                GpuInfo(index, name if isinstance(name, str) else name.decode(), memory.total, memory.free)
            )
        return found


def discover(fake_spec: str) -> list[GpuInfo]:
    """The node's GPUs. Without NVIDIA GPUs: say so once, with NVML's reason, and use the fake
    ones if set."""
    global _warned_no_nvml
    reason = "it reports none"
    try:
        real = nvml_gpus()
    except NvmlUnavailable as exc:
        real, reason = [], str(exc)
    if real:
        return real
    if not _warned_no_nvml:
        log.warning(
            "no NVIDIA GPUs found through NVML (%s)%s",
            reason,
            "; using SLOTSERVE_FAKE_GPUS" if fake_spec else "",
        )
        _warned_no_nvml = True
    return parse_fake_gpus(fake_spec) if fake_spec else []


def memory_holders(indexes: list[int]) -> dict[int, list[tuple[int, int | None]]]:
    """Per GPU, the processes holding its memory and how much (None where the driver will not
    say); ``NvmlUnavailable`` when NVML cannot be asked."""
    with nvml() as pynvml:
        holders: dict[int, list[tuple[int, int | None]]] = {}
        for index in indexes:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            running = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            holders[index] = [(proc.pid, proc.usedGpuMemory) for proc in running]
        return holders


def pids_on(indexes: list[int]) -> set[int] | None:
    """Processes using the given GPUs, or None when NVML cannot tell (fake GPUs)."""
    try:
        holders = memory_holders(indexes)
    except NvmlUnavailable:
        return None
    return {pid for held in holders.values() for pid, _ in held}
