"""Writes of a channel's story (``channels_app.models.story``, docs/scheduling.md "A channel's
story"): the scheduler's decisions, overrides and reloads, written by the scheduler; the process's
steps and a node's readiness, kept from the happenings (``on_happening``; docs/architecture.md,
"What happened, told once"). Each row is written in the transaction of what it tells."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from channels_app.models import ChannelTarget, StoryEntry, StoryKind
from slotserve_base.happenings import Happening
from slotserve_base.iso import iso_moment
from slotserve_base.vocabulary import WebhookEvent

if TYPE_CHECKING:
    from channels_app.scheduling.load_estimates import LoadEstimate

# The happenings a channel's story keeps, as its kinds.
KEPT = {
    WebhookEvent.CHANNEL_LOADING: StoryKind.LOADING,
    WebhookEvent.CHANNEL_READY: StoryKind.READY,
    WebhookEvent.CHANNEL_FAILED: StoryKind.FAILED,
    WebhookEvent.CHANNEL_FALLBACK: StoryKind.FALLBACK,
    WebhookEvent.CHANNEL_RECOVERED: StoryKind.RECOVERED,
    WebhookEvent.CHANNEL_SWITCHED: StoryKind.SWITCHED,
    WebhookEvent.CHANNEL_DRAINING: StoryKind.DRAINING,
    WebhookEvent.CHANNEL_STOPPING: StoryKind.STOPPING,
    WebhookEvent.CHANNEL_STOPPED: StoryKind.STOPPED,
    WebhookEvent.NODE_NOT_READY: StoryKind.NODE_NOT_READY,
    WebhookEvent.NODE_READY: StoryKind.NODE_READY,
}
NODE_KINDS = (StoryKind.NODE_NOT_READY, StoryKind.NODE_READY)
# A process's facts kept as they are (the names are read when the story is told).
PROCESS_FACTS = (
    "fallback",
    "error",
    "attempts",
    "retry_at",
    "attempt",
    "load_seconds",
    "sleep",
    "wake",
    "woke_seconds",
)


def told(channel_id: int, at: datetime, kind: StoryKind, **data: Any) -> None:
    StoryEntry.objects.create(channel_id=channel_id, at=at, kind=kind, data=data)


def decided(rows: Iterable[ChannelTarget], estimates: Mapping[int, LoadEstimate | None]) -> None:
    """The scheduler's new targets; ``estimates``: the estimate it planned the target's load
    with, by channel (what "was my model ready in time" is measured against), and its basis."""

    def planned(channel_id: int) -> dict[str, Any]:
        estimate = estimates.get(channel_id)
        if estimate is None:
            return {"load_seconds": None}
        return {
            "load_seconds": estimate.seconds,
            "load_basis": str(estimate.basis),
            "load_margin": estimate.margin_seconds,
        }

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
                **planned(row.channel_id),
            },
        )
        for row in rows
    )


def on_happening(sender: Any, happening: Happening, **kwargs: Any) -> None:
    """A happening the story keeps, told in each of its channels' stories."""
    kind = KEPT.get(WebhookEvent(happening.type)) if happening.type in KEPT else None
    if kind is None or not happening.channels:
        return
    if kind in NODE_KINDS:
        _node(happening, kind)
        return
    data = happening.data
    facts: dict[str, Any] = {"model_id": _id(data.get("model"))}
    if kind == StoryKind.SWITCHED:  # model to model
        facts["previous_model_id"] = _id(data.get("previous_model"))
    else:
        facts.update(preset_id=_id(data.get("preset")), booking_id=_id(data.get("booking")))
        facts.update((name, data[name]) for name in PROCESS_FACTS if name in data)
    for channel_id in happening.channels:
        told(channel_id, happening.at, kind, **facts)


def _id(named: Any) -> Any:
    return named.get("id") if isinstance(named, Mapping) else None


def _node(happening: Happening, kind: StoryKind) -> None:
    """A node's worker stopped or resumed reporting: told once per spell in each of its
    channels' stories (the readiness job may tell the same spell again)."""
    for channel_id in happening.channels:
        last = (
            StoryEntry.objects.filter(channel_id=channel_id, kind__in=NODE_KINDS)
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
