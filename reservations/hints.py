"""Warnings for a booking before it is made (docs/scheduling.md, docs/api.md, ``/api/reservations/hints``)."""

from __future__ import annotations

import math
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User

from channels_app.models import Channel, LLMModel, Preset
from channels_app.placement.estimates import preset_memory_estimate
from channels_app.placement.memory import MemoryEstimate
from channels_app.scheduling import selectors
from reservations.models import Reservation
from reservations.rules import quota_left, week_of
from reservations.selectors import held_slots
from reservations.services import needs_approval
from reservations.services.common import group_approvers, limit_problems, slot_problems
from reservations.wording import slot_words
from slotserve_base.target import Target


def adjacent_switch_minutes(*, load_seconds: float, gap_seconds: float) -> int:
    """Minutes of a slot lost to loading when the previous slot ran another model.

    Loading can start only when the previous reservation ends (docs/scheduling.md), so
    whatever of the load does not fit in the gap comes out of the new slot.
    """
    lost = load_seconds - max(gap_seconds, 0.0)
    return math.ceil(lost / 60) if lost > 0 else 0


def quota_hint(
    *, user: User, channel: Channel, start: datetime, end: datetime, **_: Any
) -> dict[str, Any] | None:
    """The weekly quota and what is left of it in the week the booking starts."""
    quota = channel.weekly_quota_hours
    if quota is None:
        return None
    held = held_slots(user=user, channel=channel, start=start, end=end)
    left = quota_left(at=start, held=held, quota_hours=quota)
    return {
        "hours": float(quota),
        "left": float(max(left, Decimal(0)).quantize(Decimal("0.01"))),
        "week": week_of(start).date().isoformat(),
    }


def memory_estimate(model: LLMModel, preset: Preset | None) -> MemoryEstimate | None:
    """The estimate when the model's file can be read here; None when it cannot."""
    return preset_memory_estimate(model, preset)


def free_vram_bytes(channel: Channel) -> int | None:
    """Free memory of the channel's GPUs as the node last reported it; None if not reported."""
    wanted = set(channel.gpu_indexes)
    free = [g.free_bytes for g in channel.node.gpus.all() if g.index in wanted]
    if not free or any(f is None for f in free):
        return None
    return sum(f for f in free if f is not None)


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


def booking_hints(
    *,
    user: User,
    channel: Channel,
    start: datetime,
    end: datetime,
    now: datetime,
    model: LLMModel | None = None,
    preset: Preset | None = None,
    exclusive: bool = False,
    note: str = "",
) -> list[dict[str, Any]]:
    warnings: list[dict[str, Any]] = []
    # Every rule the submit enforces, checked the same way: a hint never says "fine" about a
    # booking the submit would refuse. ``blocking``: the submit will refuse it.
    problems = slot_problems(channel=channel, start=start, end=end, now=now, exclusive=exclusive)
    if end > start:
        problems += limit_problems(user=user, channel=channel, start=start, end=end, now=now)
    for problem in problems:
        warnings.append(
            {"code": "rule", "field": problem.field, "message": problem.message, "blocking": True}
        )
    target = None if exclusive or model is None else Target(model.pk, preset.pk if preset else None)
    conflict = (
        Reservation.objects.blocking()
        .filter(channel=channel)
        .overlapping(start, end)
        .select_related("user")
        .order_by("start")
        .first()
    )
    if conflict is not None:
        warnings.append(
            {
                "code": "conflict",
                "field": "start",
                "message": f"the slot overlaps {conflict.user}'s booking, "
                f"{slot_words(conflict.start, conflict.end)} ({conflict.status})",
                "blocking": True,
                "reservation": conflict.pk,
            }
        )
    previous = Reservation.objects.blocking().filter(channel=channel, end__lte=start).order_by("-end").first()
    if target is not None and previous is not None and previous.target != target:
        load = selectors.load_estimates([(channel.node_id, target)])[(channel.node_id, target)]
        minutes = adjacent_switch_minutes(
            load_seconds=load, gap_seconds=(start - previous.end).total_seconds()
        )
        if minutes:
            warnings.append(
                {
                    "code": "adjacent_model_switch",
                    "message": f"the reservation before yours uses another model, so about the first "
                    f"{minutes} minute(s) of your slot go to loading",
                    "minutes_lost": minutes,
                }
            )
    vram = channel.vram_bytes()
    if model is not None and not exclusive and model.size_bytes > vram:
        warnings.append(
            {
                "code": "exceeds_vram",
                "message": f"the model's file ({_gib(model.size_bytes)}) is larger than the channel's "
                f"GPU memory ({_gib(vram)})",
            }
        )
    if model is not None and not exclusive:
        estimate = memory_estimate(model, preset)
        if estimate is not None and estimate.total > vram:
            warnings.append(
                {
                    "code": "estimated_memory_exceeds_vram",
                    "message": f"the estimated GPU memory need ({_gib(estimate.total)}: weights "
                    f"{_gib(estimate.weights)}, KV cache {_gib(estimate.kv_cache)} for {estimate.context} "
                    f"tokens, overhead {_gib(estimate.overhead)}) exceeds the channel's {_gib(vram)}",
                    "memory": estimate.as_dict(),
                }
            )
        free = free_vram_bytes(channel)
        if estimate is not None and free is not None and estimate.total <= vram and estimate.total > free:
            warnings.append(
                {
                    "code": "estimated_memory_exceeds_free",
                    "message": f"the GPUs report {_gib(free)} free now, less than the estimated "
                    f"{_gib(estimate.total)}: something else uses them",
                    "memory": estimate.as_dict(),
                }
            )
    if not exclusive and channel.idle_warn_minutes is not None:
        rule = (
            f"on this channel a booking that no request reaches within {channel.idle_warn_minutes} "
            "minutes of its start gets a warning"
        )
        if channel.idle_release_minutes is not None:
            rule += f", and {channel.idle_release_minutes} minutes later the rest of it is released to others"
        warnings.append({"code": "idle_rule", "message": rule})
    if needs_approval(channel=channel, exclusive=exclusive, user=user):
        approvers = [str(a) for a in group_approvers(user)]
        who = (
            f"{', '.join(approvers)} (your group's approver{'s' if len(approvers) > 1 else ''})"
            if approvers
            else "staff"
        )
        warnings.append({"code": "approval_required", "message": f"{who} must approve this booking"})
    return warnings
