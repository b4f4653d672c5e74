from django.contrib import admin

from channels_app.models import (
    Channel,
    ChannelRuntime,
    ChannelTarget,
    Gpu,
    LLMModel,
    LoadRecord,
    ModelFile,
    Node,
    Override,
    Preset,
)


class GpuInline(admin.TabularInline[Gpu, Node]):
    model = Gpu
    extra = 0


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin[Node]):
    list_display = ["name", "address", "last_heartbeat"]
    search_fields = ["name", "address"]
    inlines = [GpuInline]


class PresetInline(admin.TabularInline[Preset, LLMModel]):
    model = Preset
    extra = 0


@admin.register(LLMModel)
class LLMModelAdmin(admin.ModelAdmin[LLMModel]):
    list_display = ["name", "backend", "path", "size_bytes"]
    list_filter = ["backend"]
    search_fields = ["name", "path"]
    filter_horizontal = ["nodes"]
    inlines = [PresetInline]


@admin.register(Preset)
class PresetAdmin(admin.ModelAdmin[Preset]):
    list_display = ["name", "model", "args"]
    search_fields = ["name", "model__name"]
    readonly_fields = ["args_effective"]


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin[Channel]):
    list_display = ["name", "node", "gpu_indexes", "approval_policy", "default_model", "default_preset"]
    list_filter = ["approval_policy", "node"]
    search_fields = ["name"]


@admin.register(Override)
class OverrideAdmin(admin.ModelAdmin[Override]):
    list_display = ["channel", "model", "preset", "unload", "until", "set_by", "set_at"]


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
