from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from channels_app.inventory import services as inventory_services
from channels_app.models import (
    Channel,
    ChannelRuntime,
    ChannelTarget,
    Gpu,
    LLMModel,
    LoadRecord,
    ModelAlias,
    ModelFile,
    Node,
    OnDemandLoad,
    OnDemandRelease,
    Override,
    Preset,
    ReloadRequest,
)
from channels_app.models.channel import CHANNEL_SETTINGS
from channels_app.scheduling import services
from channels_app.scheduling.on_demand import on_demand_release
from slotserve_base.admin_fields import GpuIndexesField, LabelsField, MemoryField, gib
from slotserve_base.admin_services import SavedByServicesAdmin
from slotserve_base.errors import InvalidInput


class GpuAdminForm(forms.ModelForm[Gpu]):
    memory_bytes = MemoryField(label="Memory")

    class Meta:
        model = Gpu
        fields = ["index", "name", "memory_bytes"]


class GpuInline(admin.TabularInline[Gpu, Node]):
    model = Gpu
    form = GpuAdminForm
    extra = 0
    readonly_fields = ["free"]

    @admin.display(description="Free (last heard)")
    def free(self, gpu: Gpu) -> str:
        return gib(gpu.free_bytes) or "—"


class NodeAdminForm(forms.ModelForm[Node]):
    labels = LabelsField()

    class Meta:
        model = Node
        fields = ["name", "address", "labels"]


class LLMModelAdminForm(forms.ModelForm[LLMModel]):
    labels = LabelsField(help_text="Placement's selector: channels must carry these, one key=value per line.")
    size_bytes = MemoryField(label="Size", required=False, help_text="The weights' size, e.g. 14.2 GiB.")

    class Meta:
        model = LLMModel
        fields = [
            "name",
            "backend",
            "path",
            "size_bytes",
            "nodes",
            "labels",
            "placement_strategy",
            "loads_on_demand",
        ]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin[Node]):
    form = NodeAdminForm
    list_display = ["name", "address", "machine", "last_heartbeat"]
    search_fields = ["name", "address", "machine"]
    readonly_fields = ["machine", "backends", "ram_bytes", "last_heartbeat"]
    inlines = [GpuInline]


class PresetInline(admin.TabularInline[Preset, LLMModel]):
    model = Preset
    extra = 0


class ModelAliasInline(admin.TabularInline[ModelAlias, LLMModel]):
    model = ModelAlias
    extra = 0


@admin.register(LLMModel)
class LLMModelAdmin(admin.ModelAdmin[LLMModel]):
    form = LLMModelAdminForm
    list_display = ["name", "backend", "path", "size_bytes"]
    list_filter = ["backend"]
    search_fields = ["name", "path"]
    filter_horizontal = ["nodes"]
    inlines = [PresetInline, ModelAliasInline]

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """After the model and its presets are saved, channels running them look again at once."""
        super().save_related(request, form, formsets, change)
        if change:
            inventory_services.targets_changed(model=form.instance)


@admin.register(Preset)
class PresetAdmin(admin.ModelAdmin[Preset]):
    list_display = ["name", "model", "args", "places"]
    search_fields = ["name", "model__name"]
    readonly_fields = ["args_effective"]

    def save_model(self, request: HttpRequest, obj: Preset, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if change:
            inventory_services.targets_changed(preset=obj)


class ChannelAdminForm(forms.ModelForm[Channel]):
    """Saves through ``channel_save`` once the form is valid: the GPU rule under a lock of the
    node, and a re-decision at once; a save that lost a race shows as the field's error."""

    gpu_indexes = GpuIndexesField()
    labels = LabelsField()

    class Meta:
        model = Channel
        fields = list(CHANNEL_SETTINGS)

    def _post_clean(self) -> None:
        super()._post_clean()  # type: ignore[misc]  # builds the instance, runs Channel.clean
        if self.errors:
            return
        try:
            inventory_services.channel_save(channel=self.instance)
        except InvalidInput as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)


@admin.register(Channel)
class ChannelAdmin(SavedByServicesAdmin[Channel]):
    list_display = ["name", "node", "gpu_indexes", "approval_policy", "default_model", "default_preset"]
    list_filter = ["approval_policy", "node"]
    search_fields = ["name"]
    filter_horizontal = ["allowed_groups"]
    form = ChannelAdminForm


def _person(request: HttpRequest) -> User | None:
    return request.user if isinstance(request.user, User) else None


class OverrideAdminForm(forms.ModelForm[Override]):
    """Saves through ``override_set``: the same checks and re-decision as the API."""

    request_user: User | None = None  # set per request by ``OverrideAdmin.get_form``

    class Meta:
        model = Override
        fields = ["channel", "model", "preset", "unload", "until"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        try:
            self.instance = services.override_set(
                channel=data.get("channel") or self.instance.channel,
                until=data["until"],
                now=timezone.now(),
                by=self.request_user,
                model=data.get("model"),
                preset=data.get("preset"),
                unload=bool(data.get("unload")),
            )
        except InvalidInput as exc:
            raise ValidationError({exc.field: exc.message}) from None
        return data


@admin.register(Override)
class OverrideAdmin(SavedByServicesAdmin[Override]):
    form = OverrideAdminForm
    list_display = ["channel", "model", "preset", "unload", "until", "set_by", "set_at"]
    readonly_fields = ["set_by", "set_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Override | None = None) -> list[str]:
        return [*self.readonly_fields, "channel"] if obj is not None else list(self.readonly_fields)

    def delete_model(self, request: HttpRequest, obj: Override) -> None:
        services.override_clear(channel=obj.channel, now=timezone.now(), by=_person(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Override]) -> None:
        for override in queryset.select_related("channel"):
            services.override_clear(channel=override.channel, now=timezone.now(), by=_person(request))


@admin.register(LoadRecord)
class LoadRecordAdmin(admin.ModelAdmin[LoadRecord]):
    list_display = ["model", "preset", "channel", "started", "finished", "succeeded"]
    list_filter = ["succeeded", "node"]
    date_hierarchy = "started"


@admin.register(ChannelTarget)
class ChannelTargetAdmin(admin.ModelAdmin[ChannelTarget]):
    """Read-only: the scheduler is the only writer of targets."""

    list_display = ["channel", "model", "preset", "reason", "valid_until", "decided_at"]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(ReloadRequest)
class ReloadRequestAdmin(admin.ModelAdmin[ReloadRequest]):
    """Read-only: reloads are asked for with "Reload process now" (portal, API)."""

    list_display = ["channel", "generation", "requested_at", "requested_by"]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(ChannelRuntime)
class ChannelRuntimeAdmin(admin.ModelAdmin[ChannelRuntime]):
    """Read-only: the node worker is the only writer of what runs."""

    list_display = ["channel", "phase", "model", "preset", "since", "fallback", "retry_at"]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(ModelFile)
class ModelFileAdmin(admin.ModelAdmin[ModelFile]):
    """Reported by the node workers; register a model for a file under Models."""

    list_display = ["path", "node", "backend", "size_bytes", "modified", "seen_at"]
    list_filter = ["node", "backend"]
    search_fields = ["path"]


@admin.register(OnDemandLoad)
class OnDemandLoadAdmin(admin.ModelAdmin[OnDemandLoad]):
    """Models loaded on demand (docs/scheduling.md, "Loaded on demand"): recorded by the gateway's
    requests, released by the tick or here; never added or edited by hand."""

    list_display = ["model", "channel", "requested_by", "started_at", "released_at", "released_why"]
    list_filter = ["released_why", "channel"]
    actions = ["release"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: OnDemandLoad | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: OnDemandLoad | None = None) -> bool:
        return False

    @admin.action(description="Release the selected loads (their channels go back to their default)")
    def release(self, request: HttpRequest, queryset: QuerySet[OnDemandLoad]) -> None:
        now, by = timezone.now(), _person(request)
        released = sum(
            on_demand_release(load=load, now=now, why=OnDemandRelease.STAFF, by=by)
            for load in queryset.filter(released_at__isnull=True)
        )
        self.message_user(request, f"Released {released} load(s).")
