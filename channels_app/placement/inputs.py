"""Reads that turn the database into placement candidates (``channels_app.placement.chains``)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.db.models import Q

from channels_app.models import Channel, LLMModel, Preset
from channels_app.placement.chains import Candidate, Need
from channels_app.placement.estimates import model_memory_estimate
from channels_app.placement.memory import ShapeUnreadable
from channels_app.target import Target
from channels_app.vocabulary import Phase
from reservations.models import Reservation

# Booked time is measured this far around the requested slot, for the spread policy.
AROUND = timedelta(hours=12)


def need_bytes(model: LLMModel, preset: Preset | None) -> int:
    """The estimated GPU memory need; the file's size when the file cannot be read here."""
    try:
        return model_memory_estimate(model, preset.args_effective if preset else []).total
    except ShapeUnreadable:
        return model.size_bytes


def placement_inputs(
    *, model: LLMModel, preset: Preset | None, start: datetime, end: datetime, now: datetime
) -> tuple[list[Candidate], Need]:
    target = Target(model.pk, preset.pk if preset else None)
    channels = list(Channel.objects.select_related("node", "runtime").prefetch_related("node__gpus"))
    file_nodes = set(model.nodes.values_list("pk", flat=True))
    window_from, window_to = start - AROUND, end + AROUND
    nearby = Reservation.objects.blocking().filter(
        Q(start__lt=window_to, end__gt=window_from), channel__in=[c.pk for c in channels]
    )
    busy: set[int] = set()
    booked: dict[int, float] = defaultdict(float)
    node_booked: dict[int, float] = defaultdict(float)
    adjacent: set[int] = set()
    node_of = {c.pk: c.node_id for c in channels}
    for r in nearby.values("channel_id", "start", "end", "model_id", "preset_id", "exclusive"):
        channel_id = r["channel_id"]
        if r["start"] < end and r["end"] > start:
            busy.add(channel_id)
        overlap = (min(r["end"], window_to) - max(r["start"], window_from)).total_seconds()
        booked[channel_id] += overlap
        node_booked[node_of[channel_id]] += overlap
        same = not r["exclusive"] and Target(r["model_id"], r["preset_id"]) == target
        if same and (r["end"] == start or r["start"] == end):
            adjacent.add(channel_id)
    window = (window_to - window_from).total_seconds()
    channels_per_node: dict[int, int] = defaultdict(int)
    for c in channels:
        channels_per_node[c.node_id] += 1
    candidates = []
    for c in channels:
        runtime = c.runtime_or_none()
        candidates.append(
            Candidate(
                id=c.pk,
                name=c.name,
                node=c.node.name,
                node_ready=c.node.is_ready(now),
                labels={**c.node.labels, **c.labels},
                backends=frozenset(c.node.backends),
                # No discovery report for the model yet: its file's whereabouts are unknown, not absent.
                file_present=not file_nodes or c.node_id in file_nodes,
                vram_bytes=c.vram_bytes(),
                free_at_time=c.pk not in busy,
                booked_fraction=booked[c.pk] / window,
                node_booked_fraction=node_booked[c.node_id] / (window * channels_per_node[c.node_id]),
                runs_target=runtime is not None
                and runtime.phase == Phase.READY
                and runtime.running == target,
                adjacent_target=c.pk in adjacent,
            )
        )
    wanted = Need(
        model=model.name,
        backend=model.backend,
        target=target,
        labels=dict(model.labels),
        need_bytes=need_bytes(model, preset),
    )
    return candidates, wanted
