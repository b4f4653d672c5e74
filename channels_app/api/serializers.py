"""REST serializers for nodes, channels, models and presets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.contrib.auth.models import Group
from django.utils import timezone
from rest_framework import serializers

from channels_app.inventory import services as inventory_services
from channels_app.models import (
    Channel,
    Gpu,
    LLMModel,
    ModelAlias,
    ModelFile,
    Node,
    Preset,
    channel_gpus_problem,
    model_name_problem,
    preset_args_error,
)
from channels_app.models.channel import CHANNEL_SETTINGS
from channels_app.scheduling.decision import Decision, PlanSegment
from channels_app.scheduling.load_estimates import LoadEstimate
from slotserve_base.api_fields import IdOrNameField
from slotserve_base.iso import UtcDateTimeField
from slotserve_base.target import Target
from slotserve_base.vocabulary import Phase, Reason


def _labels(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise serializers.ValidationError('labels must be an object of strings, e.g. {"gpu": "a100"}')
    return value


class GpuSerializer(serializers.ModelSerializer[Gpu]):
    class Meta:
        model = Gpu
        fields = [
            "index",
            "name",
            "memory_bytes",
            "free_bytes",
            "utilization_percent",
            "temperature_c",
            "sampled_at",
        ]


class NodeSerializer(serializers.ModelSerializer[Node]):
    status = serializers.SerializerMethodField()
    gpus = GpuSerializer(many=True, read_only=True)

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "address",
            "labels",
            "status",
            "last_heartbeat",
            "machine",
            "backends",
            "ram_bytes",
            "gpus",
        ]
        read_only_fields = ["last_heartbeat", "machine", "backends", "ram_bytes"]

    def get_status(self, node: Node) -> str:
        return "ready" if node.is_ready(timezone.now()) else "not_ready"

    def validate_labels(self, value: Any) -> dict[str, str]:
        return _labels(value)


def target_json(target: Target | None, names: dict[str, dict[int, str]]) -> dict[str, Any] | None:
    if target is None:
        return None
    return {
        "model": target.model_id,
        "model_name": names["models"].get(target.model_id),
        "preset": target.preset_id,
        "preset_name": names["presets"].get(target.preset_id) if target.preset_id else None,
    }


def decision_json(decision: Decision, names: dict[str, dict[int, str]]) -> dict[str, Any]:
    return {
        "target": target_json(decision.target, names),
        "reason": str(decision.reason),
        "valid_until": UtcDateTimeField().to_representation(decision.valid_until)
        if decision.valid_until
        else None,
        "reservation": decision.reservation_id,
    }


def plan_json(segments: list[PlanSegment], names: dict[str, dict[int, str]]) -> list[dict[str, Any]]:
    field = UtcDateTimeField()
    return [
        {
            "from": field.to_representation(s.start),
            "to": field.to_representation(s.end),
            "target": target_json(s.target, names),
            "reason": str(s.reason),
            "reservation": s.reservation_id,
        }
        for s in segments
    ]


class ChannelSerializer(serializers.ModelSerializer[Channel]):
    node = IdOrNameField(queryset=Node.objects.all())
    default_model = IdOrNameField(queryset=LLMModel.objects.all(), required=False, allow_null=True)
    default_preset = serializers.PrimaryKeyRelatedField(
        queryset=Preset.objects.all(), required=False, allow_null=True
    )
    # Groups by name, as the admin shows them; none: everyone may book.
    allowed_groups = serializers.SlugRelatedField(
        slug_field="name", queryset=Group.objects.all(), many=True, required=False
    )
    vram_bytes = serializers.SerializerMethodField()
    state = serializers.SerializerMethodField()

    class Meta:
        model = Channel
        fields = ["id", *CHANNEL_SETTINGS, "vram_bytes", "state"]

    def get_vram_bytes(self, channel: Channel) -> int:
        return channel.vram_bytes()

    def get_state(self, channel: Channel) -> dict[str, Any]:
        field = UtcDateTimeField()
        runtime, target = channel.runtime_or_none(), channel.target_or_none()
        return {
            "phase": runtime.phase if runtime else Phase.STOPPED,
            "model": runtime.model_id if runtime else None,
            "preset": runtime.preset_id if runtime else None,
            # The seed's reason while the default stands in for a booked model that failed.
            "reason": Reason.FALLBACK_DEFAULT
            if runtime and runtime.fallback
            else target.reason
            if target
            else None,
            "since": field.to_representation(runtime.since) if runtime else None,
            "error": runtime.error if runtime else "",
            "retry_at": field.to_representation(runtime.retry_at) if runtime and runtime.retry_at else None,
            "fallback": runtime.fallback if runtime else False,
            # Requests its ready process serves at once (the gateway's fair queue).
            "places": runtime.places if runtime else None,
            "reservation": target.reservation_id if target else None,
            "target": None
            if target is None
            else {
                "model": target.model_id,
                "preset": target.preset_id,
                "reason": target.reason,
                "valid_until": field.to_representation(target.valid_until) if target.valid_until else None,
            },
        }

    def create(self, validated_data: dict[str, Any]) -> Channel:
        groups = validated_data.pop("allowed_groups", None)
        return inventory_services.channel_save(channel=Channel(**validated_data), allowed_groups=groups)

    def update(self, instance: Channel, validated_data: dict[str, Any]) -> Channel:
        groups = validated_data.pop("allowed_groups", None)
        for field, value in validated_data.items():
            setattr(instance, field, value)
        return inventory_services.channel_save(channel=instance, allowed_groups=groups)

    def validate_gpu_indexes(self, value: Any) -> list[int]:
        problem = channel_gpus_problem(node=None, gpu_indexes=value, channel_id=None)
        if problem:
            raise serializers.ValidationError(problem)
        return sorted(value)

    def validate_labels(self, value: Any) -> dict[str, str]:
        return _labels(value)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        node = attrs.get("node", getattr(self.instance, "node", None))
        gpus = attrs.get("gpu_indexes", getattr(self.instance, "gpu_indexes", None))
        # The model's rule (Channel.clean), shared with the admin: GPUs exist, none shared.
        problem = channel_gpus_problem(
            node=node, gpu_indexes=gpus, channel_id=getattr(self.instance, "pk", None)
        )
        if problem:
            raise serializers.ValidationError({"gpu_indexes": problem})
        model = attrs.get("default_model", getattr(self.instance, "default_model", None))
        preset = attrs.get("default_preset", getattr(self.instance, "default_preset", None))
        if preset is not None and (model is None or preset.model_id != model.pk):
            raise serializers.ValidationError(
                {
                    "default_preset": f"preset {preset.name!r} belongs to model {preset.model.name!r}, "
                    "not to the channel's default model"
                }
            )
        return attrs


def measure_size(path: str) -> int:
    """The size of a model file, or of all files in a model folder; 0 if not here."""
    where = Path(path)
    if where.is_file():
        return where.stat().st_size
    if where.is_dir():
        return sum(p.stat().st_size for p in where.rglob("*") if p.is_file())
    return 0


class LLMModelSerializer(serializers.ModelSerializer[LLMModel]):
    size_bytes = serializers.IntegerField(required=False, min_value=0)
    nodes = IdOrNameField(queryset=Node.objects.all(), many=True, required=False)
    estimated_load_seconds = serializers.SerializerMethodField()
    load_estimates = serializers.SerializerMethodField()
    exceeds_vram = serializers.SerializerMethodField()

    class Meta:
        model = LLMModel
        fields = [
            "id",
            "name",
            "backend",
            "path",
            "size_bytes",
            "nodes",
            "labels",
            "placement_strategy",
            "loads_on_demand",
            "estimated_load_seconds",
            "load_estimates",
            "exceeds_vram",
        ]

    def get_estimated_load_seconds(self, model: LLMModel) -> float:
        """The slowest of the estimates below: what to expect at worst."""
        estimates: dict[int, float] = self.context.get("load_estimates", {})
        return round(estimates.get(model.pk, 0.0), 1)

    def get_load_estimates(self, model: LLMModel) -> list[dict[str, Any]]:
        """The estimate the scheduler uses, per preset (``null``: none) and node, with what it was
        made from and the node's margin in it (docs/scheduling.md, "Load estimates")."""
        estimates: dict[tuple[int, int | None, int], LoadEstimate] = self.context.get(
            "preset_load_estimates", {}
        )
        names: dict[int, str] = self.context.get("node_names", {})
        return [
            {
                "preset": preset_id,
                "node": names.get(node_id),
                "seconds": round(estimate.seconds, 1),
                "basis": str(estimate.basis),
                "margin_seconds": round(estimate.margin_seconds, 1),
            }
            for (model_id, preset_id, node_id), estimate in sorted(
                estimates.items(), key=lambda item: (item[0][1] or 0, names.get(item[0][2], ""))
            )
            if model_id == model.pk
        ]

    def get_exceeds_vram(self, model: LLMModel) -> dict[str, bool]:
        """Per channel: is the model's file larger than the channel's GPU memory (docs/scheduling.md)?"""
        vram: dict[str, int] = self.context.get("channel_vram", {})
        return {name: model.size_bytes > memory for name, memory in vram.items()}

    def validate_name(self, value: str) -> str:
        problem = model_name_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate_labels(self, value: Any) -> dict[str, str]:
        return _labels(value)

    def create(self, validated_data: dict[str, Any]) -> LLMModel:
        if "size_bytes" not in validated_data:
            validated_data["size_bytes"] = measure_size(validated_data["path"])
        return super().create(validated_data)


class ModelFileSerializer(serializers.ModelSerializer[ModelFile]):
    node_name = serializers.CharField(source="node.name")
    registered = serializers.SerializerMethodField()

    class Meta:
        model = ModelFile
        fields = [
            "id",
            "node",
            "node_name",
            "path",
            "backend",
            "size_bytes",
            "modified",
            "seen_at",
            "registered",
        ]

    def get_registered(self, found: ModelFile) -> bool:
        return found.path in self.context.get("registered_paths", set())


class ModelAliasSerializer(serializers.ModelSerializer[ModelAlias]):
    model = IdOrNameField(queryset=LLMModel.objects.all())

    class Meta:
        model = ModelAlias
        fields = ["id", "name", "model"]

    def validate_name(self, value: str) -> str:
        if LLMModel.objects.filter(name=value).exists():
            raise serializers.ValidationError(
                f"{value!r} is the name of a model; an alias needs a name of its own"
            )
        return value


class PresetSerializer(serializers.ModelSerializer[Preset]):
    model = IdOrNameField(queryset=LLMModel.objects.all())
    args_effective = serializers.ListField(child=serializers.CharField(), read_only=True)
    args_error = serializers.CharField(read_only=True)
    memory = serializers.SerializerMethodField()

    class Meta:
        model = Preset
        fields = ["id", "model", "name", "args", "places", "args_effective", "args_error", "memory"]

    def get_memory(self, preset: Preset) -> dict[str, Any]:
        """The GPU memory estimate in bytes, or why there is none (the file is not on this machine)."""
        from channels_app.placement.estimates import model_memory_estimate
        from channels_app.placement.memory import ShapeUnreadable

        try:
            estimate = model_memory_estimate(preset.model, preset.args_effective)
        except ShapeUnreadable as exc:
            return {"error": str(exc)}
        return estimate.as_dict()

    def validate_args(self, value: str) -> str:
        error = preset_args_error(value)  # the model's rule (Preset.clean), shared with the admin
        if error:
            raise serializers.ValidationError(error)
        return value
