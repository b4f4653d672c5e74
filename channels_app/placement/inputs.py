"""Reads that turn the database into placement candidates (``channels_app.placement.chains``)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

from channels_app.backends import draft_model_path
from channels_app.models import Channel, LLMModel, ModelFile, Preset
from channels_app.placement.chains import Candidate, Need
from channels_app.placement.estimates import model_memory_estimate
from channels_app.placement.memory import ShapeUnreadable
from channels_app.scheduling.selectors import booked_spans
from slotserve_base.target import Target
from slotserve_base.vocabulary import Phase

# Spread counts the bookings this far around the requested slot.
AROUND = timedelta(hours=12)


def memory_need(model: LLMModel, preset: Preset | None) -> tuple[int, int]:
    """The estimated GPU memory and RAM needs; the file's size (all on the GPU) when the file
    cannot be read here."""
    try:
        estimate = model_memory_estimate(model, preset.args_effective if preset else [])
    except ShapeUnreadable:
        return model.size_bytes, 0
    return estimate.total, estimate.ram


def need_bytes(model: LLMModel, preset: Preset | None) -> int:
    """The estimated GPU memory need; the file's size when the file cannot be read here."""
    return memory_need(model, preset)[0]


def placement_inputs(
    *, model: LLMModel, preset: Preset | None, start: datetime, end: datetime, now: datetime
) -> tuple[list[Candidate], Need]:
    target = Target(model.pk, preset.pk if preset else None)
    channels = list(Channel.objects.select_related("node", "runtime").prefetch_related("node__gpus"))
    file_nodes = set(model.nodes.values_list("pk", flat=True))
    draft = draft_model_path(model.backend, preset.args_effective) if preset is not None else None
    # Nodes whose discovery found the draft file; none anywhere: its whereabouts are unknown.
    draft_nodes = (
        set(ModelFile.objects.filter(path=draft).values_list("node_id", flat=True)) if draft else set()
    )
    window_from, window_to = start - AROUND, end + AROUND
    nearby = booked_spans(start=window_from, end=window_to, channel_ids=[c.pk for c in channels])
    busy: set[int] = set()
    adjacent: set[int] = set()
    # (channel or node, current model?) → instances: bookings around the slot, processes now.
    on_channel: Counter[tuple[int, bool]] = Counter()
    on_node: Counter[tuple[int, bool]] = Counter()
    node_of = {c.pk: c.node_id for c in channels}

    def count(channel_id: int, model_id: int | None) -> None:
        current = model_id == model.pk
        on_channel[channel_id, current] += 1
        on_node[node_of[channel_id], current] += 1

    for r in nearby:
        channel_id = r.channel_id
        if r.start < end and r.end > start:
            busy.add(channel_id)
        count(channel_id, r.model_id)
        same = not r.exclusive and Target(r.model_id, r.preset_id) == target
        if same and (r.end == start or r.start == end):
            adjacent.add(channel_id)
    runtimes = {c.pk: c.runtime_or_none() for c in channels}
    if window_from <= now < window_to:
        for channel_id, runtime in runtimes.items():
            running = runtime.running if runtime is not None else None
            if running is not None:
                count(channel_id, running.model_id)
    candidates = []
    for c in channels:
        runtime = runtimes[c.pk]
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
                ram_bytes=c.node.ram_bytes,
                channel_current=on_channel[c.pk, True],
                channel_others=on_channel[c.pk, False],
                node_current=on_node[c.node_id, True],
                node_others=on_node[c.node_id, False],
                runs_target=runtime is not None
                and runtime.phase == Phase.READY
                and runtime.running == target,
                adjacent_target=c.pk in adjacent,
                draft_present=None if draft is None else (not draft_nodes or c.node_id in draft_nodes),
            )
        )
    gpu_need, ram_need = memory_need(model, preset)
    wanted = Need(
        model=model.name,
        backend=model.backend,
        target=target,
        labels=dict(model.labels),
        need_bytes=gpu_need,
        ram_bytes=ram_need,
    )
    return candidates, wanted
