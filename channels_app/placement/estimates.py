"""A model's GPU memory estimate wherever this host is: the file read here if it is here,
else the shape a node that has the file reported (``ModelFile.shape``)."""

from __future__ import annotations

from collections.abc import Sequence

from channels_app.models import LLMModel, ModelFile, Preset
from channels_app.placement.memory import MemoryEstimate, ShapeUnreadable, estimate_for, estimate_from_shape


def model_memory_estimate(model: LLMModel, args: Sequence[str]) -> MemoryEstimate:
    """Raises ``ShapeUnreadable`` saying why when neither this host nor any node can tell."""
    try:
        return estimate_for(backend=model.backend, path=model.path, args=args)
    except ShapeUnreadable as here:
        reported = ModelFile.objects.filter(path=model.path, shape__isnull=False).order_by("-seen_at").first()
        if reported is None or reported.shape is None:
            raise ShapeUnreadable(f"{here} (and no node has reported the file's shape)") from None
        return estimate_from_shape(backend=model.backend, shape=reported.shape, args=args)


def preset_memory_estimate(model: LLMModel, preset: Preset | None) -> MemoryEstimate | None:
    """The estimate of a model + preset, or None when nothing can tell."""
    try:
        return model_memory_estimate(model, preset.args_effective if preset is not None else [])
    except ShapeUnreadable:
        return None
