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


FAKE_NAME = "Fake GPU"


class FakeGpuSpecError(ValueError):
    pass


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_bytes: int
    free_bytes: int
    utilization_percent: int | None = None  # the share of the last sample period it computed
    temperature_c: int | None = None


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
            gpus.append(GpuInfo(len(gpus), FAKE_NAME, memory, memory))
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
                GpuInfo(
                    index,
                    name if isinstance(name, str) else name.decode(),
                    memory.total,
                    memory.free,
                    _asked(lambda h=handle: pynvml.nvmlDeviceGetUtilizationRates(h).gpu, pynvml),
                    _asked(
                        lambda h=handle: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                        pynvml,
                    ),
                )
            )
        return found


def _asked(read: Any, pynvml: Any) -> int | None:
    """One reading NVML may not support on this card (a MIG slice has no temperature): None then."""
    try:
        return int(read())
    except pynvml.NVMLError:
        return None


# A fake GPU's temperature: idle at 32 °C, 78 °C at full use (a data-centre card's range).
IDLE_C, BUSY_C = 32, 78
_watched: dict[int, Any] = {}  # pid → psutil.Process, whose CPU use is measured between samples


def fake_use(found: list[GpuInfo], holders: dict[int, list[int]]) -> list[GpuInfo]:
    """Fake GPUs report what their channels' processes use of the machine, so a lab without
    NVIDIA cards still sees believable, moving numbers: the memory the processes hold (their
    resident size) as used, their CPU use since the last sample (shared among the GPUs a process
    holds) as utilisation, and a temperature that follows it. ``holders``: GPU index → the pids
    of the processes on it."""
    import psutil

    shares: dict[int, int] = {}
    for pids in holders.values():
        for pid in pids:
            shares[pid] = shares.get(pid, 0) + 1
    use: dict[int, tuple[int, float]] = {}  # pid → its resident memory and CPU use, read once
    for pid in shares:
        try:
            process = _watched.setdefault(pid, psutil.Process(pid))
            use[pid] = (process.memory_info().rss, process.cpu_percent(interval=None))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            _watched.pop(pid, None)
    sampled = []
    for gpu in found:
        on_it = [pid for pid in holders.get(gpu.index, []) if pid in use]
        used = sum(use[pid][0] // shares[pid] for pid in on_it)
        percent = min(round(sum(use[pid][1] / shares[pid] for pid in on_it)), 100)
        sampled.append(
            GpuInfo(
                gpu.index,
                gpu.name,
                gpu.memory_bytes,
                max(gpu.memory_bytes - used, 0),
                percent,
                IDLE_C + round((BUSY_C - IDLE_C) * percent / 100),
            )
        )
    alive = {pid for pids in holders.values() for pid in pids}
    for pid in set(_watched) - alive:
        del _watched[pid]
    return sampled


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


def is_fake(found: list[GpuInfo]) -> bool:
    return bool(found) and all(gpu.name == FAKE_NAME for gpu in found)


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
