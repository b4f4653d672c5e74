"""Placement read from the database: the candidates of a model at a time, ranked (docs/scheduling.md).

Used by the placement API, the booking dialog and "book any channel that fits"
(``reservations.services.reservation_create_anywhere``).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from channels_app.models import LLMModel, Preset, validate_target
from channels_app.placement.chains import FreeSlot, Placement, ScoreMaximums, first_free, place
from channels_app.placement.inputs import placement_inputs
from channels_app.scheduling.selectors import booked_spans


def maximums() -> ScoreMaximums:
    return ScoreMaximums(
        placement=settings.SLOTSERVE_SCORE_PLACEMENT_MAX,
        locality=settings.SLOTSERVE_SCORE_LOCALITY_MAX,
        warm=settings.SLOTSERVE_SCORE_WARM_MAX,
    )


def placement_for(
    *,
    model: LLMModel,
    start: datetime,
    end: datetime,
    preset: Preset | None = None,
    policy: str | None = None,
) -> Placement:
    """``policy`` None: the model's own ``placement_strategy``."""
    validate_target(model=model, preset=preset)
    candidates, wanted = placement_inputs(
        model=model, preset=preset, start=start, end=end, now=timezone.now()
    )
    return place(candidates, wanted, policy=policy or model.placement_strategy, maximums=maximums())


# The free-slot finder looks this far ahead, at starts this far apart.
FINDER_HORIZON = timedelta(days=14)
FINDER_STEP = timedelta(minutes=30)


def free_slots(
    *,
    model: LLMModel,
    length: timedelta,
    after: datetime,
    now: datetime,
    preset: Preset | None = None,
    count: int = 3,
    policy: str | None = None,
) -> tuple[list[FreeSlot], Placement]:
    """The next times some channel that fits ``model`` is free for ``length``, from ``after``
    (rounded up to the half hour) to two weeks on; and placement at ``after`` (its message says
    why nothing fits when nothing ever can)."""
    validate_target(model=model, preset=preset)
    policy = policy or model.placement_strategy
    first = _round_up(max(after, now), FINDER_STEP)
    candidates, wanted = placement_inputs(
        model=model, preset=preset, start=first, end=first + length, now=now
    )
    busy: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    for booked in booked_spans(start=first, end=first + FINDER_HORIZON + length):
        busy[booked.channel_id].append((booked.start, booked.end))
    starts = (first + i * FINDER_STEP for i in range(int(FINDER_HORIZON / FINDER_STEP)))
    found = first_free(
        candidates,
        wanted,
        busy=busy,
        starts=starts,
        length=length,
        count=count,
        policy=policy,
        maximums=maximums(),
    )
    return found, place(candidates, wanted, policy=policy, maximums=maximums())


def _round_up(moment: datetime, step: timedelta) -> datetime:
    epoch = datetime(2000, 1, 1, tzinfo=moment.tzinfo)
    steps = -((epoch - moment) // step)  # ceiling division
    return epoch + steps * step
