"""``GET /api/placement``: the whole filter-and-score chain for a model at a time."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from channels_app.models import LLMModel, Preset
from channels_app.placement.chains import Placement
from channels_app.placement.selectors import placement_for
from slotserve_site.api_fields import IdOrNameField, MomentField


class PlacementInput(serializers.Serializer[Any]):
    model = IdOrNameField(queryset=LLMModel.objects.all())
    preset = serializers.PrimaryKeyRelatedField(
        queryset=Preset.objects.all(), required=False, allow_null=True
    )
    start = MomentField()
    end = MomentField()
    policy = serializers.ChoiceField(
        choices=["binpack", "spread"], required=False, help_text="default: the model's placement_strategy"
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": "end must be after start"})
        return attrs


def placement_json(result: Placement) -> dict[str, Any]:
    return {
        "channels": [
            {
                "channel": s.candidate.id,
                "name": s.candidate.name,
                "node": s.candidate.node,
                "scores": s.scores,
                "total": round(s.total, 2),
            }
            for s in result.ranked
        ],
        "removed": {
            name: [{"channel": channel, "reason": why} for channel, why in entries]
            for name, entries in result.removed.items()
        },
        "message": result.message,
    }


class PlacementView(APIView):
    def get(self, request: Request) -> Response:
        data = PlacementInput(data=request.query_params)
        data.is_valid(raise_exception=True)
        return Response(placement_json(placement_for(**data.validated_data)))
