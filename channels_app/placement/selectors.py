"""Placement read from the database: the candidates of a model at a time, ranked (SPEC §7).

Used by the placement API, the booking dialog and "book any channel that fits"
(``reservations.services.reservation_create_anywhere``).
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.utils import timezone

from channels_app.models import LLMModel, Preset
from channels_app.placement.chains import Placement, ScoreMaximums, place
from channels_app.placement.inputs import placement_inputs
from channels_app.target import validate_target


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
