"""The load-time estimate of docs/scheduling.md ("Load estimates"), as a pure function."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from statistics import fmean

RECENT_LOADS = 5
# The node's last loads whose shortfall against their estimate teaches its margin.
MARGIN_LOADS = 20
FIRST_LOAD_EXTRA_SECONDS = 15.0
BYTES_PER_MB = 1_000_000  # disk speeds are quoted in decimal megabytes per second
# A load of a smaller file says little of the disk: start-up dominates it.
READ_SPEED_MIN_BYTES = 1_000_000_000


class Basis(StrEnum):
    """What an estimate was made from, most telling first."""

    PRESET_HERE = "preset_here"
    MODEL_HERE = "model_here"
    PRESET_ELSEWHERE = "preset_elsewhere"
    MODEL_ELSEWHERE = "model_elsewhere"
    NODE_READ_SPEED = "node_read_speed"
    DISK_SETTING = "disk_setting"

    @property
    def words(self) -> str:
        return BASIS_WORDS[self]


BASIS_WORDS = {
    Basis.PRESET_HERE: "its last loads on this node",
    Basis.MODEL_HERE: "the slowest of this model's recent loads on this node with other presets",
    Basis.PRESET_ELSEWHERE: "the slowest of its recent loads on other nodes",
    Basis.MODEL_ELSEWHERE: "the slowest of this model's recent loads on other nodes",
    Basis.NODE_READ_SPEED: "the file's size at this node's measured read speed",
    Basis.DISK_SETTING: "the file's size at SLOTSERVE_DISK_READ_MBPS",
}


@dataclass(frozen=True)
class LoadHistory:
    """What is known of one model + preset's loads, seen from one node. Durations are in
    seconds, newest first."""

    size_bytes: int = 0
    preset_here: Sequence[float] = ()
    model_here: Sequence[float] = ()
    preset_elsewhere: Sequence[float] = ()
    model_elsewhere: Sequence[float] = ()
    # The node's read speed as its loads of large files showed it; None before any.
    node_read_mbps: float | None = None
    # The node's last loads' ``took − estimated`` (newest first): the misses teach the margin.
    node_shortfalls: Sequence[float] = field(default=())


@dataclass(frozen=True)
class LoadEstimate:
    seconds: float  # what the scheduler plans with: the basis's seconds + the margin
    basis: Basis
    margin_seconds: float = 0.0

    @property
    def unmargined_seconds(self) -> float:
        return self.seconds - self.margin_seconds


def estimate_load(history: LoadHistory, *, disk_read_mbps: float) -> LoadEstimate:
    """Seconds a model + preset needs to load on a node, and what that was made from.

    The mean of its last five loads there; before its first, the slowest of what comes
    nearest (the model's loads there with other presets, its loads on other nodes), then its
    file read at the node's measured speed, then at ``SLOTSERVE_DISK_READ_MBPS``, plus 15 s of
    start-up. To that comes the node's margin: the largest amount by which one of its last 20
    loads took longer than its estimate.
    """
    basis, seconds = _based(history, disk_read_mbps)
    margin = learnt_margin(history.node_shortfalls)
    return LoadEstimate(seconds=seconds + margin, basis=basis, margin_seconds=margin)


def learnt_margin(shortfalls: Sequence[float]) -> float:
    return max((s for s in shortfalls[:MARGIN_LOADS] if s > 0), default=0.0)


def _based(history: LoadHistory, disk_read_mbps: float) -> tuple[Basis, float]:
    if history.preset_here:
        return Basis.PRESET_HERE, fmean(history.preset_here[:RECENT_LOADS])
    for basis, loads in (
        (Basis.MODEL_HERE, history.model_here),
        (Basis.PRESET_ELSEWHERE, history.preset_elsewhere),
        (Basis.MODEL_ELSEWHERE, history.model_elsewhere),
    ):
        if loads:
            return basis, max(loads[:RECENT_LOADS])
    if history.node_read_mbps:
        return Basis.NODE_READ_SPEED, _read_seconds(history.size_bytes, history.node_read_mbps)
    return Basis.DISK_SETTING, _read_seconds(history.size_bytes, disk_read_mbps)


def _read_seconds(size_bytes: int, mbps: float) -> float:
    return size_bytes / (mbps * BYTES_PER_MB) + FIRST_LOAD_EXTRA_SECONDS


def read_speed_mbps(loads: Sequence[tuple[int, float]]) -> float | None:
    """A node's read speed from its loads ``(file bytes, seconds)``: a load reads its whole file,
    so each large one bounds the speed from below; the fastest bound is the measure."""
    speeds = [
        size / seconds / BYTES_PER_MB
        for size, seconds in loads
        if size >= READ_SPEED_MIN_BYTES and seconds > 0
    ]
    return max(speeds, default=None)
