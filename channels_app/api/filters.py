"""Query filters of the inventory lists (django-filter)."""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet

from channels_app.models import LLMModel, ModelFile, Preset
from slotserve_base.api_fields import is_id


class PresetFilter(django_filters.FilterSet):
    model = django_filters.CharFilter(method="by_model", help_text="model id or name")

    class Meta:
        model = Preset
        fields = ["model"]

    def by_model(self, queryset: QuerySet[Preset], name: str, value: str) -> QuerySet[Preset]:
        return queryset.filter(model_id=int(value)) if is_id(value) else queryset.filter(model__name=value)


class ModelFileFilter(django_filters.FilterSet):
    """``?registered=false``: the files a node found that no model names yet."""

    registered = django_filters.BooleanFilter(method="by_registration")

    class Meta:
        model = ModelFile
        fields = ["registered", "node"]

    def by_registration(self, queryset: QuerySet[ModelFile], name: str, value: bool) -> QuerySet[ModelFile]:
        paths = LLMModel.objects.values("path")
        return queryset.filter(path__in=paths) if value else queryset.exclude(path__in=paths)
