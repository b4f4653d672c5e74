"""Choosing channels for a model: filter, then score (docs/scheduling.md, after GPUStack), as pure functions.

Each filter removes the channels that cannot run the model and says why; the
scorers rank the rest, each up to its own maximum; the highest total wins and
ties break by name. When nothing is left the answer counts every reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from slotserve_base.target import Target

GiB = 2**30


@dataclass(frozen=True)
class Candidate:
    """A channel as placement sees it."""

    id: int
    name: str
    node: str
    node_ready: bool
    labels: Mapping[str, str]  # the node's labels overlaid with the channel's
    backends: frozenset[str]  # found installed on the node
    file_present: bool  # the model's file is on the node's disk
    vram_bytes: int
    free_at_time: bool  # no pending or approved reservation overlaps the slot
    ram_bytes: int | None = None  # the node's memory, as its worker reports it
    # What spread counts: processes running now and bookings around the slot, of the wanted
    # model ("current") and of other models ("others"), on this channel and on its whole node.
    channel_current: int = 0
    channel_others: int = 0
    node_current: int = 0
    node_others: int = 0
    runs_target: bool = False  # the same model + preset is loaded now
    adjacent_target: bool = False  # a reservation right before or after uses the same target
    # The preset's draft model (speculative decoding) is on the node's disk; None: it names none.
    draft_present: bool | None = None


@dataclass(frozen=True)
class Need:
    model: str
    backend: str
    target: Target
    labels: Mapping[str, str]  # the model's selector
    need_bytes: int  # estimated GPU memory (or the file's size when no estimate can be made)
    ram_bytes: int = 0  # estimated weights left in the machine's memory (llama.cpp's -ngl)


@dataclass(frozen=True)
class ScoreMaximums:
    """Each scorer's maximum, as the seed gives them: placement 100, model-file locality a light
    preference of 5 (0 turns a scorer off). ``warm`` is SlotServe's own: no load lost (the channel
    runs the target already, or it is booked right beside), as light as locality."""

    placement: float = 100.0
    locality: float = 5.0
    warm: float = 5.0

    @property
    def scale(self) -> float:
        """The seed's ``scale_factor = total_max / sum_max``: totals out of 100."""
        total = sum(m for m in (self.placement, self.locality, self.warm) if m > 0)
        return TOTAL_MAX / total if total > 0 else 1.0


TOTAL_MAX = 100.0


@dataclass(frozen=True)
class Scored:
    candidate: Candidate
    scores: dict[str, float]
    scale: float = 1.0  # ScoreMaximums.scale

    @property
    def total(self) -> float:
        return sum(self.scores.values()) * self.scale


@dataclass(frozen=True)
class Placement:
    ranked: list[Scored]
    removed: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # filter → [(channel, why)]
    message: str = ""


Filter = Callable[[Candidate, Need], str | None]


def _node_ready(c: Candidate, w: Need) -> str | None:
    return None if c.node_ready else f"node {c.node} not ready"


def _labels(c: Candidate, w: Need) -> str | None:
    missing = [f"{k}={v}" for k, v in w.labels.items() if c.labels.get(k) != v]
    return f"lacks labels {', '.join(missing)}" if missing else None


def _backend(c: Candidate, w: Need) -> str | None:
    return None if w.backend in c.backends else f"{w.backend} not installed on {c.node}"


def _file(c: Candidate, w: Need) -> str | None:
    if not c.file_present:
        return f"model file not on {c.node}"
    if c.draft_present is False:
        return f"draft model file not on {c.node}"
    return None


def _memory(c: Candidate, w: Need) -> str | None:
    if w.need_bytes <= c.vram_bytes:
        return None
    return f"too little GPU memory (needs {w.need_bytes / GiB:.1f} GiB, has {c.vram_bytes / GiB:.1f} GiB)"


def _ram(c: Candidate, w: Need) -> str | None:
    """The rest of the seed's resource fit ("enough RAM/VRAM"): weights a preset leaves in the
    machine's memory (llama.cpp's ``-ngl`` below the layers) fit the node's RAM, where its
    worker reports it."""
    if w.ram_bytes <= 0 or c.ram_bytes is None or w.ram_bytes <= c.ram_bytes:
        return None
    return f"too little RAM (needs {w.ram_bytes / GiB:.1f} GiB, has {c.ram_bytes / GiB:.1f} GiB)"


def _free(c: Candidate, w: Need) -> str | None:
    return None if c.free_at_time else "booked at that time"


# The chain, in the seed's order (GPUStack's: labels, worker status, backend, local path, resource
# fit), SlotServe's "free at that time" last; the first filter that removes a channel gives its
# reason. (GPUStack's cluster and GPU-matching filters have no counterpart: a channel is one
# node's GPUs already.)
FILTERS: list[tuple[str, Filter]] = [
    ("labels", _labels),
    ("node_ready", _node_ready),
    ("backend", _backend),
    ("file", _file),
    ("memory", _memory),
    ("ram", _ram),
    ("free", _free),
]

# How each removal is counted in the "nothing fits" message.
_REASON_WORDS = {
    "node_ready": "node not ready",
    "labels": "lack the model's labels",
    "backend": "lack the backend",
    "file": "lack the model file",
    "memory": "have too little GPU memory",
    "ram": "have too little RAM",
    "free": "are booked at that time",
}


# The seed's weights (GPUStack's placement scorer): binpack's resources, GPU memory against RAM;
# spread's dimensions, the worker (a channel's node) against its GPUs (the channel), and the
# instances of other models against the wanted model's own.
VRAM_WEIGHT, RAM_WEIGHT = 2.0, 1.0
NODE_WEIGHT, CHANNEL_WEIGHT = 0.85, 0.15
OTHERS_WEIGHT = 0.2


def placement_score(c: Candidate, w: Need, policy: str, maximum: float) -> float:
    """binpack: the fullest fit scores highest (the share of the channel's GPU memory the model
    would use, weighing 2, and of the node's RAM, weighing 1 where the model leaves weights in
    RAM and the node reports it); spread: the fewest instances of the model, then of others, on
    the node (0.85) and on the channel (0.15)."""
    if policy == "binpack":
        if not c.vram_bytes:
            return 0.0
        vram_share = w.need_bytes / c.vram_bytes
        if w.ram_bytes > 0 and c.ram_bytes:
            ram_share = min(w.ram_bytes / c.ram_bytes, 1.0)
            return maximum * (VRAM_WEIGHT * vram_share + RAM_WEIGHT * ram_share) / (VRAM_WEIGHT + RAM_WEIGHT)
        return maximum * vram_share

    def crowding(current: int, others: int) -> float:
        return 1 / (1 + current + OTHERS_WEIGHT * others)

    return maximum * (
        NODE_WEIGHT * crowding(c.node_current, c.node_others)
        + CHANNEL_WEIGHT * crowding(c.channel_current, c.channel_others)
    )


DRAFT_WEIGHT = 0.5


def locality_score(c: Candidate, maximum: float) -> float:
    """The seed's model-file locality: the share of the candidate's workers that have the file,
    times the maximum (a channel is one node's GPUs, so the share is 1 or 0); with a draft model,
    ``(main_ratio + 0.5 · draft_ratio) / 1.5 × max``."""
    if maximum <= 0:
        return 0.0
    main = 1.0 if c.file_present else 0.0
    if c.draft_present is None:
        return maximum * main
    draft = 1.0 if c.draft_present else 0.0
    return maximum * (main + DRAFT_WEIGHT * draft) / (1 + DRAFT_WEIGHT)


def warm_score(c: Candidate, maximum: float) -> float:
    """SlotServe's own: no load lost, the channel runs the target already or it is booked right
    beside the slot."""
    return maximum if maximum > 0 and (c.runs_target or c.adjacent_target) else 0.0


def place(
    candidates: Sequence[Candidate],
    wanted: Need,
    *,
    policy: str = "binpack",
    maximums: ScoreMaximums = ScoreMaximums(),
) -> Placement:
    if policy not in ("binpack", "spread"):
        raise ValueError(f"placement policy {policy!r}: use binpack or spread")
    removed: dict[str, list[tuple[str, str]]] = {}
    kept: list[Candidate] = []
    for candidate in candidates:
        for name, check in FILTERS:
            why = check(candidate, wanted)
            if why is not None:
                removed.setdefault(name, []).append((candidate.name, why))
                break
        else:
            kept.append(candidate)
    ranked = [
        Scored(
            c,
            {
                "placement": round(placement_score(c, wanted, policy, maximums.placement), 2),
                "locality": round(locality_score(c, maximums.locality), 2),
                "warm": round(warm_score(c, maximums.warm), 2),
            },
            maximums.scale,
        )
        for c in kept
    ]
    ranked.sort(key=lambda s: (-s.total, s.candidate.name))
    return Placement(ranked, removed, "" if ranked else nothing_fits(len(candidates), removed))


def nothing_fits(total: int, removed: Mapping[str, list[tuple[str, str]]]) -> str:
    """The seed's diagnostic form: '0/3 channels: 1 node not ready, 2 have too little GPU memory
    (needs 23.1 GiB, have 16.0 GiB)'."""
    parts = fit_parts(removed)
    return f"0/{total} channels: " + ", ".join(parts) if parts else f"0/{total} channels"


def fit_parts(removed: Mapping[str, list[tuple[str, str]]]) -> list[str]:
    """Each filter's count of removals, in the chain's order ("2 have too little GPU memory …")."""
    parts = []
    for name, _ in FILTERS:
        entries = removed.get(name, [])
        if not entries:
            continue
        count = len(entries)
        detail = ""
        if name in ("memory", "ram"):
            # "(needs 23.1 GiB, has 16.0 GiB)" per channel → "(needs 23.1 GiB, have 16.0 GiB, 24.0 GiB)"
            pairs = [why.split("(", 1)[1].rstrip(")").split(", has ") for _, why in entries]
            haves = sorted(set(has for _, has in pairs), key=lambda h: float(h.split()[0]))
            verb = "has" if len(haves) == 1 and count == 1 else "have"
            detail = f" ({pairs[0][0]}, {verb} {', '.join(haves)})"
        words = _REASON_WORDS[name]
        if count == 1 and name != "node_ready":
            words = words.replace("have ", "has ").replace("lack ", "lacks ").replace("are ", "is ")
        parts.append(f"{count} {words}{detail}")
    return parts


@dataclass(frozen=True)
class FreeSlot:
    """A time at which channels that fit the model are all free, best first; ``free_until``:
    when the best one's free stretch ends (None: not within the search)."""

    start: datetime
    end: datetime
    ranked: list[Scored]
    free_until: datetime | None = None


def first_free(
    candidates: Sequence[Candidate],
    wanted: Need,
    *,
    busy: Mapping[int, Sequence[tuple[datetime, datetime]]],
    starts: Iterable[datetime],
    length: timedelta,
    count: int,
    policy: str = "binpack",
    maximums: ScoreMaximums = ScoreMaximums(),
) -> list[FreeSlot]:
    """The first ``count`` times (from ``starts``) at which some channel that fits is free for
    ``length``, each with the channels ranked as placement ranks them. Each channel's free
    stretch is offered once, at its first fitting start (with when it ends): the times offered
    are different stretches, not one stretch cut into pieces. ``busy``: each channel's booked
    slots."""
    found: list[FreeSlot] = []
    offered: dict[int, datetime | None] = {}  # channel → the end of the stretch offered already

    def not_offered(channel_id: int, start: datetime) -> bool:
        """Whether ``start`` lies in a stretch of the channel not offered yet."""
        if channel_id not in offered:
            return True
        until = offered[channel_id]
        return until is not None and start >= until

    def stretch_end(channel_id: int, end: datetime) -> datetime | None:
        later = [s for s, _ in busy.get(channel_id, ()) if s >= end]
        return min(later) if later else None

    for start in starts:
        end = start + length
        at_time = [
            replace(c, free_at_time=not any(s < end and e > start for s, e in busy.get(c.id, ())))
            for c in candidates
        ]
        ranked = [
            scored
            for scored in place(at_time, wanted, policy=policy, maximums=maximums).ranked
            if not_offered(scored.candidate.id, start)
        ]
        if not ranked:
            continue
        for scored in ranked:
            offered[scored.candidate.id] = stretch_end(scored.candidate.id, end)
        found.append(FreeSlot(start, end, ranked, offered[ranked[0].candidate.id]))
        if len(found) >= count:
            break
    return found
