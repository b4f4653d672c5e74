"""The node's GPUs: NVIDIA's through NVML, or fake ones for machines without them."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

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


def _nvml_gpus() -> list[GpuInfo] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            found.append(
                GpuInfo(index, name if isinstance(name, str) else name.decode(), memory.total, memory.free)
            )
        return found
    finally:
        pynvml.nvmlShutdown()


def discover(fake_spec: str) -> list[GpuInfo]:
    """The node's GPUs. Without NVIDIA GPUs: say so once, and use the fake ones if set."""
    global _warned_no_nvml
    real = _nvml_gpus()
    if real:
        return real
    if not _warned_no_nvml:
        log.warning("no NVIDIA GPUs found through NVML%s", "; using SLOTSERVE_FAKE_GPUS" if fake_spec else "")
        _warned_no_nvml = True
    return parse_fake_gpus(fake_spec) if fake_spec else []


def pids_on(indexes: list[int]) -> set[int] | None:
    """Processes using the given GPUs, or None when NVML cannot tell (fake GPUs)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver: cannot tell
        return None
    try:
        pids: set[int] = set()
        for index in indexes:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                pids.add(proc.pid)
        return pids
    finally:
        pynvml.nvmlShutdown()
