"""Writes of the inventory: nodes, models and presets that other facts refer to."""

from __future__ import annotations

from django.db import transaction

from channels_app.errors import InUse
from channels_app.models import ChannelRuntime, ChannelTarget, LLMModel, Preset
from channels_app.vocabulary import SERVING_PHASES, Phase


def _channels_using(*, model: LLMModel | None = None, preset: Preset | None = None) -> list[str]:
    running = ChannelRuntime.objects.filter(phase__in=[*SERVING_PHASES, Phase.STOPPING])
    wanted = ChannelTarget.objects.all()
    if model is not None:
        running, wanted = running.filter(model=model), wanted.filter(model=model)
    if preset is not None:
        running, wanted = running.filter(preset=preset), wanted.filter(preset=preset)
    names = set(running.values_list("channel__name", flat=True)) | set(
        wanted.values_list("channel__name", flat=True)
    )
    return sorted(names)


def model_delete(*, model: LLMModel) -> None:
    """Delete a model no channel runs or is heading for; its presets go with it.

    Reservations that name it keep it (``PROTECT``): the database refuses, and
    the API answers 409 naming them.
    """
    using = _channels_using(model=model)
    if using:
        raise InUse(f"cannot delete model {model.name}: channel {', '.join(using)} runs it or is about to")
    with transaction.atomic():
        model.delete()


def preset_delete(*, preset: Preset) -> None:
    using = _channels_using(preset=preset)
    if using:
        raise InUse(f"cannot delete preset {preset}: channel {', '.join(using)} runs it or is about to")
    with transaction.atomic():
        preset.delete()
