"""REST views for the inventory, overrides and the scheduling decision."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.http import HttpResponseBase, StreamingHttpResponse
from django.utils import timezone
from redis.exceptions import RedisError
from rest_framework import permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound, PermissionDenied
from rest_framework.generics import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response

from channels_app.api.filters import ModelFileFilter, PresetFilter
from channels_app.api.serializers import (
    ChannelSerializer,
    LLMModelSerializer,
    ModelAliasSerializer,
    ModelFileSerializer,
    NodeSerializer,
    PresetSerializer,
    decision_json,
    plan_json,
)
from channels_app.inventory import services as inventory_services
from channels_app.models import Channel, LLMModel, ModelAlias, ModelFile, Node, Override, Preset
from channels_app.models.channel import channels_bookable_by
from channels_app.node_worker.log_shipping import valid_cursor
from channels_app.node_worker.run_logs import for_member, lines_since, recent_lines_with_cursor, whole_log
from channels_app.scheduling import services
from channels_app.scheduling.selectors import preset_load_estimate_details
from slotserve_base.api_fields import (
    ChannelsWithinKeyScope,
    IdOrNameField,
    IsStaffOrReadOnly,
    MomentField,
    UnscopedKeyToChange,
    current_user,
    moment_param,
)

# A plan longer than this is refused: it would be slow and unreadable.
MAX_PLAN = timedelta(days=62)


class ServiceUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "service_unavailable"


def name_maps() -> dict[str, dict[int, str]]:
    return {
        "models": dict(LLMModel.objects.values_list("pk", "name")),
        "presets": dict(Preset.objects.values_list("pk", "name")),
    }


class NodeViewSet(viewsets.ModelViewSet[Node]):
    queryset = Node.objects.prefetch_related("gpus")
    serializer_class = NodeSerializer
    permission_classes = [IsStaffOrReadOnly, UnscopedKeyToChange]


class LLMModelViewSet(viewsets.ModelViewSet[LLMModel]):
    queryset = LLMModel.objects.prefetch_related("nodes")
    serializer_class = LLMModelSerializer
    permission_classes = [IsStaffOrReadOnly, UnscopedKeyToChange]

    def perform_update(self, serializer: Any) -> None:
        inventory_services.targets_changed(model=serializer.save())

    def perform_destroy(self, instance: LLMModel) -> None:
        inventory_services.model_delete(model=instance)

    def get_serializer_context(self) -> dict[str, Any]:
        context = dict(super().get_serializer_context())
        channels = Channel.objects.select_related("node").prefetch_related("node__gpus")
        context["channel_vram"] = {c.name: c.vram_bytes() for c in channels}
        by_target = preset_load_estimate_details()
        context["load_estimates"] = {}
        for (model_id, _, _), estimate in by_target.items():
            worst = max(estimate.seconds, context["load_estimates"].get(model_id, 0.0))
            context["load_estimates"][model_id] = worst
        context["preset_load_estimates"] = by_target
        context["node_names"] = dict(Node.objects.values_list("pk", "name"))
        return context


class ModelFileViewSet(viewsets.ReadOnlyModelViewSet[ModelFile]):
    """Model files the node workers found; ``?registered=false`` lists those to offer for registration."""

    serializer_class = ModelFileSerializer

    queryset = ModelFile.objects.select_related("node")
    filterset_class = ModelFileFilter

    def get_serializer_context(self) -> dict[str, Any]:
        context = dict(super().get_serializer_context())
        context["registered_paths"] = set(LLMModel.objects.values_list("path", flat=True))
        return context


class ModelAliasViewSet(viewsets.ModelViewSet[ModelAlias]):
    """Other names clients may use for models (``gpt-4o-mini`` → a local model); staff write."""

    queryset = ModelAlias.objects.select_related("model")
    serializer_class = ModelAliasSerializer
    permission_classes = [IsStaffOrReadOnly, UnscopedKeyToChange]


class PresetViewSet(viewsets.ModelViewSet[Preset]):
    queryset = Preset.objects.select_related("model")
    serializer_class = PresetSerializer
    filterset_class = PresetFilter
    permission_classes = [IsStaffOrReadOnly, UnscopedKeyToChange]

    def perform_update(self, serializer: Any) -> None:
        inventory_services.targets_changed(preset=serializer.save())

    def perform_destroy(self, instance: Preset) -> None:
        inventory_services.preset_delete(preset=instance)


class OverrideInput(serializers.Serializer[Any]):
    model = IdOrNameField(queryset=LLMModel.objects.all(), required=False, allow_null=True)
    preset = serializers.PrimaryKeyRelatedField(
        queryset=Preset.objects.all(), required=False, allow_null=True
    )
    unload = serializers.BooleanField(required=False, default=False)
    until = MomentField()


class OverrideOutput(serializers.ModelSerializer[Override]):
    class Meta:
        model = Override
        fields = ["channel", "model", "preset", "unload", "until", "set_by", "set_at"]


class ChannelViewSet(viewsets.ModelViewSet[Channel]):
    queryset = Channel.objects.select_related("node", "runtime", "target").prefetch_related(
        "node__gpus", "allowed_groups"
    )
    serializer_class = ChannelSerializer
    permission_classes = [IsStaffOrReadOnly, ChannelsWithinKeyScope]

    @action(
        detail=True,
        methods=["post", "delete"],
        permission_classes=[permissions.IsAdminUser, ChannelsWithinKeyScope],
    )
    def override(self, request: Request, pk: str | None = None) -> Response:
        channel = self.get_object()
        if request.method == "DELETE":
            services.override_clear(channel=channel, now=timezone.now(), by=current_user(request))
            return Response(status=status.HTTP_204_NO_CONTENT)
        data = OverrideInput(data=request.data)
        data.is_valid(raise_exception=True)
        override = services.override_set(
            channel=channel,
            now=timezone.now(),
            by=current_user(request),
            **data.validated_data,
        )
        return Response(OverrideOutput(override).data, status=status.HTTP_201_CREATED)

    @action(
        detail=True, methods=["post"], permission_classes=[permissions.IsAdminUser, ChannelsWithinKeyScope]
    )
    def reload(self, request: Request, pk: str | None = None) -> Response:
        channel = self.get_object()
        generation = services.channel_reload(channel=channel, now=timezone.now(), by=current_user(request))
        return Response(
            {"channel": channel.pk, "reload_generation": generation}, status=status.HTTP_202_ACCEPTED
        )

    @action(detail=True, methods=["get"])
    def log(self, request: Request, pk: str | None = None) -> HttpResponseBase:
        """The run log of the channel's current or last process: the last lines for
        everyone (``?lines=``, default 200), the whole file for staff (``?full=1``). Each answer
        has a ``cursor``; ``?after=<cursor>`` gives only the lines shipped since (``new_run``
        says a new process began, whose lines replace the old), to follow a log live. Members
        read the channels they may book, without the lines about single requests."""
        channel = self.get_object()
        staff = request.user.is_staff
        if not staff and not channels_bookable_by(current_user(request)).filter(pk=channel.pk).exists():
            raise NotFound("no channel with this id that you may use")
        if request.query_params.get("full"):
            if not request.user.is_staff:
                raise PermissionDenied("only staff may read whole run logs")
            whole = whole_log(channel)
            if whole is None:
                raise NotFound("this channel has no run log yet")
            return StreamingHttpResponse(whole, content_type="text/plain; charset=utf-8")
        try:
            count = max(1, min(int(request.query_params.get("lines", 200)), 5000))
        except ValueError:
            raise serializers.ValidationError({"lines": "lines must be a whole number"}) from None
        after = request.query_params.get("after")
        if after is not None:
            if not valid_cursor(after):
                raise serializers.ValidationError({"after": "after must be a cursor from an earlier answer"})
            try:
                lines, cursor, new_run = lines_since(channel, after, count)
            except RedisError:
                raise ServiceUnavailable("run-log lines are unavailable while Redis is away") from None
            lines = lines if staff else for_member(lines)
            return Response({"channel": channel.pk, "lines": lines, "cursor": cursor, "new_run": new_run})
        lines, cursor = recent_lines_with_cursor(channel, count)
        lines = lines if staff else for_member(lines)
        return Response({"channel": channel.pk, "lines": lines, "cursor": cursor, "new_run": False})

    @action(detail=True, methods=["get"])
    def decision(self, request: Request, pk: str | None = None) -> Response:
        channel = get_object_or_404(Channel, pk=pk)
        now = timezone.now()
        at = moment_param(request, "at", default=now)
        decision = services.decision_for(channel=channel, now=now, at=at)
        return Response(decision_json(decision, name_maps()))

    @action(detail=True, methods=["get"])
    def plan(self, request: Request, pk: str | None = None) -> Response:
        channel = get_object_or_404(Channel, pk=pk)
        now = timezone.now()
        start = moment_param(request, "from", default=now)
        end = moment_param(request, "to", default=start + timedelta(days=1))
        if end <= start:
            raise serializers.ValidationError({"to": "to must be after from"})
        if end - start > MAX_PLAN:
            raise serializers.ValidationError({"to": f"a plan covers at most {MAX_PLAN.days} days"})
        segments = services.plan_for(channel=channel, now=now, start=start, end=end)
        return Response(plan_json(segments, name_maps()))
