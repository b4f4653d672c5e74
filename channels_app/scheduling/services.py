"""Writes of the scheduler: each channel's target, overrides and reloads.

The scheduler is the only writer of ``ChannelTarget`` (docs/architecture.md, one writer
per fact); the decision itself is ``channels_app.scheduling.decision.decide``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F

from channels_app import story
from channels_app.models import (
    Channel,
    ChannelTarget,
    LLMModel,
    Override,
    Preset,
    ReloadRequest,
    StoryKind,
    validate_target,
)
from channels_app.scheduling import selectors
from channels_app.scheduling.decision import Decision, PlanSegment, decide, decide_at, plan
from channels_app.scheduling.load_estimates import LoadEstimate
from slotserve_base import dispatch, news, overview
from slotserve_base.audit import audited
from slotserve_base.dispatch import enqueue_redecide
from slotserve_base.errors import InvalidInput
from slotserve_base.iso import iso_moment

log = logging.getLogger(__name__)


def _row_values(decision: Decision) -> tuple[object, ...]:
    """The stored fields of a decision, in ``_TARGET_FIELDS`` order."""
    target = decision.target
    return (
        target.model_id if target else None,
        target.preset_id if target else None,
        str(decision.reason),
        decision.valid_until,
        decision.reservation_id,
    )


_TARGET_FIELDS = ("model_id", "preset_id", "reason", "valid_until", "reservation_id")


def _stored_values(stored: ChannelTarget | None) -> tuple[object, ...] | None:
    if stored is None:
        return None
    return tuple(getattr(stored, name) for name in _TARGET_FIELDS)


@dataclass(frozen=True)
class TickResult:
    channels: int
    changed: list[int]
    # Each decided channel's ``valid_until``: when its decision may change without new input.
    valid_until: dict[int, datetime | None] = field(default_factory=dict)


def decide_channels(*, now: datetime, channel_ids: Iterable[int] | None = None) -> TickResult:
    """Decide every channel (or the given ones) at ``now`` and store what changed.

    Unchanged targets are not written, so a steady tick costs the same few
    reads whatever the number of channels; ``decided_at`` stays the moment
    the current target was first chosen.
    """
    facts = selectors.decision_inputs(now=now, channel_ids=channel_ids)
    changed_rows: list[ChannelTarget] = []
    load_seconds: dict[int, LoadEstimate | None] = {}
    valid_until: dict[int, datetime | None] = {}
    for channel_id, fact in facts.items():
        decision = decide(fact.decision_input, now)
        valid_until[channel_id] = decision.valid_until
        values = _row_values(decision)
        try:
            stored: ChannelTarget | None = fact.channel.target
        except ChannelTarget.DoesNotExist:
            stored = None
        if _stored_values(stored) != values:
            changed_rows.append(
                ChannelTarget(
                    channel_id=channel_id, decided_at=now, **dict(zip(_TARGET_FIELDS, values, strict=True))
                )
            )
            if decision.target is not None:
                load_seconds[channel_id] = fact.estimates.get(decision.target)
    if changed_rows:
        with transaction.atomic():
            # Another decider (the tick, a re-decision at a booking's edge) may have stored the
            # same change since this one read: kept once, in the story too (docs/scheduling.md).
            stored_now = {
                row.channel_id: _stored_values(row)
                for row in ChannelTarget.objects.select_for_update().filter(
                    channel_id__in=[r.channel_id for r in changed_rows]
                )
            }
            changed_rows = [r for r in changed_rows if stored_now.get(r.channel_id) != _stored_values(r)]
            load_seconds = {
                c: v for c, v in load_seconds.items() if c in {r.channel_id for r in changed_rows}
            }
            ChannelTarget.objects.bulk_create(
                changed_rows,
                update_conflicts=True,
                unique_fields=["channel"],
                update_fields=["model", "preset", "reason", "valid_until", "reservation", "decided_at"],
            )
            story.decided(changed_rows, load_seconds)
    changed = [row.channel_id for row in changed_rows]
    overview.refresh(changed, "target")
    if changed:
        news.changed("target")
    if changed:
        log.info("scheduler: %d of %d channels have a new target", len(changed), len(facts))
    return TickResult(channels=len(facts), changed=changed, valid_until=valid_until)


def decision_for(*, channel: Channel, now: datetime, at: datetime) -> Decision:
    """The decision at ``at`` from the stored data, with no side effects."""
    low, high = min(now, at), max(now, at)
    inp = selectors.channel_window_inputs(channel=channel, start=low, end=high)
    return decide_at(inp, now, at)


def plan_for(*, channel: Channel, now: datetime, start: datetime, end: datetime) -> list[PlanSegment]:
    """The decisions from ``start`` to ``end`` as a timeline, with no side effects.

    A plan that starts in the future begins with what the channel would run
    then, by the plan from now; one that starts in the past assumes the
    channel ran each decision at once.
    """
    return plans_for(channel_ids=[channel.pk], now=now, start=start, end=end)[channel.pk]


def plans_for(
    *, channel_ids: Iterable[int], now: datetime, start: datetime, end: datetime
) -> dict[int, list[PlanSegment]]:
    """``plan_for`` of each channel, from one read of all their inputs."""
    low = min(now, start)
    inputs = selectors.channels_window_inputs(channel_ids=channel_ids, start=low, end=end)
    if start > now:
        return {pk: [s for s in plan(inp, now, end) if s.end > start] for pk, inp in inputs.items()}
    return {pk: plan(inp, start, end) for pk, inp in inputs.items()}


def override_set(
    *,
    channel: Channel,
    until: datetime,
    now: datetime,
    by: User | None,
    model: LLMModel | None = None,
    preset: Preset | None = None,
    unload: bool = False,
) -> Override:
    """Set the channel's override (docs/scheduling.md rule 4), replacing any earlier one."""
    if until <= now:
        raise InvalidInput("until", "until must be in the future")
    if unload and model is not None:
        raise InvalidInput("unload", "give either a model (and preset) or unload, not both")
    if not unload and model is None:
        raise InvalidInput("model", "give a model (and preset), or unload: true")
    validate_target(model=model, preset=preset)
    with transaction.atomic():
        override, _ = Override.objects.update_or_create(
            channel=channel,
            defaults={
                "model": model,
                "preset": preset,
                "unload": unload,
                "until": until,
                "set_by": by,
                "set_at": now,
            },
        )
        story.told(
            channel.pk,
            now,
            StoryKind.OVERRIDE_SET,
            model_id=model.pk if model else None,
            preset_id=preset.pk if preset else None,
            unload=unload,
            until=iso_moment(until),
            by=by.get_username() if by else None,
        )
        enqueue_redecide(channel.pk)
    return override


def override_clear(*, channel: Channel, now: datetime, by: User | None) -> bool:
    with transaction.atomic():
        deleted, _ = Override.objects.filter(channel=channel).delete()
        if deleted:
            story.told(channel.pk, now, StoryKind.OVERRIDE_CLEARED, by=by.get_username() if by else None)
            enqueue_redecide(channel.pk)
    return bool(deleted)


def channel_reload(*, channel: Channel, now: datetime, by: User | None = None) -> int:
    """Ask the node worker to restart the channel's process at once, without draining.

    Returns the request's generation. The reload is a fact of its own (``ReloadRequest``):
    the scheduler's target is the scheduler's alone to write.
    """
    with transaction.atomic():
        ReloadRequest.objects.get_or_create(channel=channel)
        ReloadRequest.objects.filter(channel=channel).update(
            generation=F("generation") + 1, requested_at=now, requested_by=by
        )
        generation = ReloadRequest.objects.values_list("generation", flat=True).get(channel=channel)
        audited(channel, {"reload": None}, {"reload": f"requested (#{generation})"})  # the trail
        story.told(channel.pk, now, StoryKind.RELOAD, by=by.get_username() if by else None)
        node_name = channel.node.name
        # The node acts now, not at its next tick.
        transaction.on_commit(
            lambda: dispatch.send_to_node(dispatch.CHANNEL_RECONCILE, (channel.pk,), node_name),
            robust=True,  # Redis away: the node's own tick picks the reload up
        )
    return int(generation)
