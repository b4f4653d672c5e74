"""The models and presets one reconcile step reads, each row once.

A step names the same model and presets for its default, its target, its process, its load and
its story; read where each is needed, they were a quarter of a step's 20-29 queries
(docs/benchmarks.md, "The pushes, and the steps' reads"). What a step reads is read when it
begins, so an edit made meanwhile counts at the next step.
"""

from __future__ import annotations

from collections.abc import Iterable

from channels_app.models import LLMModel, Preset
from slotserve_base.target import Target


class StepReads:
    def __init__(self) -> None:
        self._models: dict[int, LLMModel | None] = {}
        self._presets: dict[int, Preset | None] = {}

    def read(self, targets: Iterable[Target | None]) -> None:
        """Read the targets' presets (with their models) in one query, and the models of those
        without a preset in one more."""
        named = [t for t in targets if t is not None]
        preset_ids = {t.preset_id for t in named if t.preset_id is not None} - self._presets.keys()
        if preset_ids:
            found = {p.pk: p for p in Preset.objects.select_related("model").filter(pk__in=preset_ids)}
            for pk in preset_ids:
                preset = self._presets[pk] = found.get(pk)
                if preset is not None:
                    self._models[preset.model_id] = preset.model
        model_ids = {t.model_id for t in named} - self._models.keys()
        if model_ids:
            found_models = LLMModel.objects.in_bulk(model_ids)
            for pk in model_ids:
                self._models[pk] = found_models.get(pk)

    def model(self, pk: int | None) -> LLMModel | None:
        if pk is None:
            return None
        if pk not in self._models:
            self._models[pk] = LLMModel.objects.filter(pk=pk).first()
        return self._models[pk]

    def preset(self, pk: int | None) -> Preset | None:
        if pk is None:
            return None
        if pk not in self._presets:
            preset = self._presets[pk] = Preset.objects.select_related("model").filter(pk=pk).first()
            if preset is not None:
                self._models.setdefault(preset.model_id, preset.model)
        return self._presets[pk]
