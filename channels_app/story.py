"""Writes of a channel's story (``channels_app.models.story``, docs/scheduling.md "A channel's
story"), by the stages that know what happened: the scheduler its decisions, overrides and
reloads, the node worker its process's steps (``node_worker.announce``), and a node's readiness
from the happenings (``on_happening``). Each row is written in the transaction of what it tells."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from channels_app.models import ChannelTarget, StoryEntry, StoryKind
from slotserve_base.happenings import Happening
from slotserve_base.iso import iso_moment
from slotserve_base.vocabulary import WebhookEvent

NODE_KINDS = {
    WebhookEvent.NODE_NOT_READY: StoryKind.NODE_NOT_READY,
    WebhookEvent.NODE_READY: StoryKind.NODE_READY,
}


def told(channel_id: int, at: datetime, kind: StoryKind, **data: Any) -> None:
    StoryEntry.objects.create(channel_id=channel_id, at=at, kind=kind, data=data)


def decided(rows: Iterable[ChannelTarget], load_seconds: Mapping[int, float | None]) -> None:
    """The scheduler's new targets; ``load_seconds``: the estimate it planned the target's load
    with, by channel (what "was my model ready in time" is measured against)."""
    StoryEntry.objects.bulk_create(
        StoryEntry(
            channel_id=row.channel_id,
            at=row.decided_at,
            kind=StoryKind.DECIDED,
            data={
                "model_id": row.model_id,
                "preset_id": row.preset_id,
                "reason": str(row.reason),
                "until": iso_moment(row.valid_until) if row.valid_until else None,
                "booking_id": row.reservation_id,
                "load_seconds": load_seconds.get(row.channel_id),
            },
        )
        for row in rows
    )


def on_happening(sender: Any, happening: Happening, **kwargs: Any) -> None:
    """A node's worker stopped or resumed reporting: told once per spell in each of its
    channels' stories (the readiness job may tell the same spell again)."""
    kind = NODE_KINDS.get(WebhookEvent(happening.type)) if happening.type in NODE_KINDS else None
    if kind is None or not happening.channels:
        return
    for channel_id in happening.channels:
        last = (
            StoryEntry.objects.filter(channel_id=channel_id, kind__in=list(NODE_KINDS.values()))
            .order_by("-at", "-pk")
            .values_list("kind", flat=True)
            .first()
        )
        if last == kind or (last is None and kind == StoryKind.NODE_READY):
            continue
        told(
            channel_id,
            happening.at,
            kind,
            node=dict(happening.data.get("node") or {}),
            last_heartbeat=happening.data.get("last_heartbeat"),
        )
