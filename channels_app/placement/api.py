"""``GET /api/placement``: the whole filter-and-score chain for a model at a time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from channels_app.models import LLMModel, Preset
from channels_app.placement.chains import Placement
from channels_app.placement.selectors import FINDER_HORIZON, free_slots, placement_for
from slotserve_base.api_fields import IdOrNameField, MomentField
from slotserve_base.time_words import moment_words, reader_zone, slot_words


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


class FreeSlotsInput(serializers.Serializer[Any]):
    model = IdOrNameField(queryset=LLMModel.objects.all())
    preset = serializers.PrimaryKeyRelatedField(
        queryset=Preset.objects.all(), required=False, allow_null=True
    )
    hours = serializers.FloatField(min_value=0.25, max_value=24 * 7, help_text="how long the slot lasts")
    after = MomentField(required=False, help_text="default: now")
    count = serializers.IntegerField(min_value=1, max_value=10, default=3)


class FreeSlotsView(APIView):
    """``GET /api/placement/free-slots``: the next times some channel that fits the model is
    free for ``hours`` (two weeks ahead at most), each with the channels placement would choose."""

    def get(self, request: Request) -> Response:
        data = FreeSlotsInput(data=request.query_params)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        now = timezone.now()
        found, at_first = free_slots(
            model=fields["model"],
            preset=fields.get("preset"),
            length=timedelta(hours=fields["hours"]),
            after=fields.get("after") or now,
            now=now,
            count=fields["count"],
        )
        message = ""
        if not found:
            days = FINDER_HORIZON.days
            message = (
                f"no channel that fits {fields['model'].name} is free for {fields['hours']:g} hours "
                f"in the next {days} days"
            )
            if at_first.message:
                message += f" ({at_first.message})"
        zone = reader_zone(request.user)
        return Response(
            {
                "slots": [
                    {
                        "start": slot.start,
                        "end": slot.end,
                        "free_until": slot.free_until,
                        # In the caller's zone, named as every page names it (IST, not GMT+5:30).
                        "words": slot_words(slot.start, slot.end, zone),
                        "free_until_words": moment_words(slot.free_until, zone) if slot.free_until else "",
                        "channels": [
                            {
                                "channel": s.candidate.id,
                                "name": s.candidate.name,
                                "node": s.candidate.node,
                                "total": round(s.total, 2),
                            }
                            for s in slot.ranked[:3]
                        ],
                    }
                    for slot in found
                ],
                "message": message,
            }
        )
