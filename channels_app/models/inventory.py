"""The inventory: nodes and their GPUs, models and presets, channels, model files on disk."""

from __future__ import annotations

import shlex
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from channels_app.backends import Backend, effective_args
from slotserve_base.errors import InvalidInput
from slotserve_base.target import Target

if TYPE_CHECKING:
    from channels_app.models.state import ChannelRuntime, ChannelTarget

# A node is ready while its heartbeat is younger than this many ticks (docs/scheduling.md).
HEARTBEAT_TICKS = 3


class Node(models.Model):
    """One machine with GPUs; runs one SlotServe node worker."""

    name = models.CharField(max_length=100, unique=True)
    address = models.CharField(
        max_length=255, blank=True, help_text="Host or IP the gateway reaches the node's processes at."
    )
    labels = models.JSONField(default=dict, blank=True)
    backends = models.JSONField(
        default=list, blank=True, help_text="Backends the node worker found installed."
    )
    ram_bytes = models.BigIntegerField(
        null=True, blank=True, help_text="The machine's memory (RAM), as its node worker reports it."
    )
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    machine = models.CharField(
        max_length=255,
        blank=True,
        help_text="The host name of the machine whose node worker heartbeats under this name.",
    )
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def is_ready(self, now: datetime) -> bool:
        if self.last_heartbeat is None:
            return False
        limit = timedelta(seconds=HEARTBEAT_TICKS * settings.SLOTSERVE_TICK_SECONDS)
        return now - self.last_heartbeat <= limit

    def beating_elsewhere(self, machine: str, now: datetime) -> bool:
        """Whether a machine other than ``machine`` heartbeats under this node's name now."""
        return self.machine not in ("", machine) and self.is_ready(now)


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=200, blank=True)
    memory_bytes = models.BigIntegerField()
    free_bytes = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["node", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node"),
            models.CheckConstraint(condition=Q(memory_bytes__gte=0), name="gpu_memory_not_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}:{self.index} {self.name}"


class LLMModel(models.Model):
    """A model file (GGUF) or folder (HF) on nodes' disks, with its backend."""

    name = models.CharField(max_length=200, unique=True)
    backend = models.CharField(max_length=20, choices=Backend.choices)
    path = models.CharField(max_length=1000)
    size_bytes = models.BigIntegerField(default=0)
    nodes = models.ManyToManyField(
        Node, blank=True, related_name="models", help_text="Nodes whose disk holds the file."
    )
    labels = models.JSONField(
        default=dict, blank=True, help_text="Labels a channel must carry to run this model."
    )
    placement_strategy = models.CharField(
        max_length=10,
        choices=[
            ("binpack", "binpack: the smallest channel that fits"),
            ("spread", "spread: the least busy"),
        ],
        default="binpack",
        help_text="How 'any channel' bookings and the dialog's suggestions choose a channel (seed 001).",
    )
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        verbose_name = "model"
        constraints = [
            models.CheckConstraint(condition=Q(size_bytes__gte=0), name="model_size_not_negative"),
        ]

    def __str__(self) -> str:
        return self.name


class ModelAlias(models.Model):
    """Another name clients may use for a model (``gpt-4o-mini`` → a local model): the gateway
    routes a request for the alias as one for the model. No alias is also a model's name."""

    name = models.CharField(max_length=200, unique=True)
    model = models.ForeignKey(LLMModel, on_delete=models.CASCADE, related_name="aliases")

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "model aliases"
        constraints = [models.CheckConstraint(condition=~Q(name=""), name="model_alias_name_not_empty")]

    def __str__(self) -> str:
        return f"{self.name} → {self.model}"

    def clean(self) -> None:
        problem = alias_name_problem(self.name)
        if problem:
            raise ValidationError({"name": problem})


def alias_name_problem(name: str) -> str:
    """Why ``name`` cannot be an alias ("" when it can): a model has that name."""
    if LLMModel.objects.filter(name=name).exists():
        return f"{name!r} is the name of a model; an alias needs a name of its own"
    return ""


def model_name_problem(name: str) -> str:
    """Why ``name`` cannot be a model's name ("" when it can): an alias of a model has it."""
    taken = ModelAlias.objects.filter(name=name).select_related("model").first()
    if taken is not None:
        return f"{name!r} is an alias of model {taken.model.name}; remove the alias first"
    return ""


class Preset(models.Model):
    """Extra command-line arguments for a model; model + preset is one target."""

    model = models.ForeignKey(LLMModel, on_delete=models.CASCADE, related_name="presets")
    name = models.CharField(max_length=100)
    args = models.TextField(blank=True, help_text="Split like a shell would, never run by one.")

    class Meta:
        ordering = ["model__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["model", "name"], name="preset_unique_name_per_model"),
        ]

    def __str__(self) -> str:
        return f"{self.model.name}/{self.name}"

    def clean(self) -> None:
        """The rule every edge shares (API, admin): the arguments split like a shell would."""
        error = preset_args_error(self.args)
        if error:
            raise ValidationError({"args": error})

    @property
    def args_error(self) -> str:
        """Why the stored arguments cannot be used ("" when they can)."""
        return preset_args_error(self.args)

    @property
    def args_list(self) -> list[str]:
        """The arguments as written; raises ``ValueError`` when they do not split."""
        return split_preset_args(self.args)

    @property
    def args_effective(self) -> list[str]:
        """The arguments without the owned ones; none when they do not split (see ``args_error``)."""
        if self.args_error:
            return []
        return effective_args(Backend(self.model.backend), self.args_list)


def split_preset_args(args: str) -> list[str]:
    """``args`` split like a shell would (never run by one); ``ValueError`` says what is wrong."""
    if "\0" in args:
        raise ValueError("the arguments contain a NUL character")
    return shlex.split(args)


def preset_args_error(args: str) -> str:
    try:
        split_preset_args(args)
    except ValueError as exc:
        return f"cannot split the arguments like a shell would: {exc}"
    return ""


class ApprovalPolicy(models.TextChoices):
    NONE = "none", "No approval"
    EXCLUSIVE_ONLY = "exclusive_only", "Whole-card bookings need approval"
    ALL = "all", "Every booking needs approval"


class Channel(models.Model):
    """A group of GPUs on one node; runs at most one inference process."""

    name = models.CharField(max_length=100, unique=True)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="channels")
    gpu_indexes = models.JSONField(default=list, help_text="Indexes of the node's GPUs, e.g. [0, 1].")
    approval_policy = models.CharField(
        max_length=20, choices=ApprovalPolicy.choices, default=ApprovalPolicy.NONE
    )
    default_model = models.ForeignKey(
        LLMModel, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    default_preset = models.ForeignKey(
        Preset, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    labels = models.JSONField(default=dict, blank=True)
    allow_whole_card = models.BooleanField(
        default=True, help_text="May users book the whole card (no inference process)?"
    )
    # Booking limits an admin sets per channel (None: no limit).
    min_booking_minutes = models.PositiveIntegerField(default=15, help_text="Shortest booking.")
    max_booking_minutes = models.PositiveIntegerField(null=True, blank=True, help_text="Longest booking.")
    max_days_ahead = models.PositiveIntegerField(
        null=True, blank=True, help_text="How far ahead a booking may start."
    )
    weekly_quota_hours = models.DecimalField(
        max_digits=6,
        decimal_places=2,
        null=True,
        blank=True,
        help_text="Hours one user may hold on this channel per week (Monday to Monday, UTC).",
    )
    # Slots that are not wasted (reservations.idle): a model booking no request reached within
    # idle_warn_minutes of its start is warned; idle_release_minutes later still unused, the rest
    # of it is released to others. Whole-card bookings are exempt (their use is invisible here).
    # Groups (Django's auth groups: a lab, a project): a channel limited to some is booked by
    # their members (and staff) only; each group may hold this many hours a week on it.
    allowed_groups = models.ManyToManyField(
        "auth.Group",
        blank=True,
        related_name="channels",
        help_text="Only members of these groups (and staff) may book this channel. None: everyone.",
    )
    group_weekly_quota_hours = models.DecimalField(
        max_digits=7,
        decimal_places=2,
        null=True,
        blank=True,
        help_text="Hours the members of one group may hold together on this channel per week.",
    )
    idle_warn_minutes = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Tell the booker when no request reached their model booking this many minutes "
        "after its start. Empty: off.",
    )
    idle_release_minutes = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="After that warning, release the rest of the booking when still unused this many "
        "minutes later. Empty: never release.",
    )
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(default_preset__isnull=True) | Q(default_model__isnull=False),
                name="channel_default_preset_needs_model",
            ),
            models.CheckConstraint(
                condition=Q(max_booking_minutes__isnull=True)
                | Q(max_booking_minutes__gte=models.F("min_booking_minutes")),
                name="channel_booking_limits_ordered",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: object, **kwargs: object) -> None:
        """Save with the channel's GPU claims, in one transaction: a GPU another channel of the
        node holds makes the database refuse the whole save (``IntegrityError``)."""
        with transaction.atomic():
            super().save(*args, **kwargs)  # type: ignore[arg-type]
            held = set(self.gpu_claims.filter(node_id=self.node_id).values_list("index", flat=True))
            wanted = {i for i in self.gpu_indexes if isinstance(i, int) and not isinstance(i, bool)}
            self.gpu_claims.exclude(node_id=self.node_id, index__in=wanted).delete()
            GpuClaim.objects.bulk_create(
                GpuClaim(channel=self, node_id=self.node_id, index=i) for i in sorted(wanted - held)
            )

    @property
    def default_target(self) -> Target | None:
        if self.default_model_id is None:
            return None
        return Target(self.default_model_id, self.default_preset_id)

    def runtime_or_none(self) -> ChannelRuntime | None:
        try:
            return self.runtime
        except ObjectDoesNotExist:
            return None

    def target_or_none(self) -> ChannelTarget | None:
        try:
            return self.target
        except ObjectDoesNotExist:
            return None

    def clean(self) -> None:
        """The rule every edge shares (API, admin): the channel's GPUs exist on its node and
        belong to no other channel of that node."""
        problem = channel_gpus_problem(
            node=self.node if self.node_id else None, gpu_indexes=self.gpu_indexes, channel_id=self.pk
        )
        if problem:
            raise ValidationError({"gpu_indexes": problem})

    def vram_bytes(self) -> int:
        """The memory of the channel's GPUs; uses ``node.gpus`` (prefetch it)."""
        wanted = set(self.gpu_indexes)
        return sum(gpu.memory_bytes for gpu in self.node.gpus.all() if gpu.index in wanted)


class GpuClaim(models.Model):
    """One GPU of a node that a channel holds, kept by ``Channel.save``: the database's own
    guard that no two channels of a node share a GPU (a JSON list cannot carry a constraint).
    ``channel_gpus_problem`` says the same earlier, in words."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="gpu_claims")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    index = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_claim_one_channel_per_gpu")
        ]

    def __str__(self) -> str:
        return f"{self.node_id}:{self.index} → {self.channel_id}"


class ModelFile(models.Model):
    """A model file or folder a node worker found in its model folders (SLOTSERVE_MODEL_DIRS)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="model_files")
    path = models.CharField(max_length=1000)
    backend = models.CharField(max_length=20, choices=Backend.choices)
    size_bytes = models.BigIntegerField()
    modified = models.DateTimeField()
    seen_at = models.DateTimeField(default=timezone.now)
    # What memory estimates need, read on the node (GGUF metadata; config.json and safetensors
    # sizes), so a web host without the file can estimate too (placement.memory).
    shape = models.JSONField(null=True, blank=True)
    shape_error = models.TextField(blank=True)

    class Meta:
        ordering = ["node__name", "path"]
        constraints = [models.UniqueConstraint(fields=["node", "path"], name="model_file_unique_per_node")]

    def __str__(self) -> str:
        return f"{self.node}:{self.path}"


def channel_gpus_problem(*, node: Node | None, gpu_indexes: object, channel_id: int | None) -> str:
    """Why ``gpu_indexes`` cannot be a channel of ``node`` ("" when it can).

    Two channels sharing a GPU would load two models onto it, and an index the node does not
    have gives a channel no memory at all. Checked by ``channel_save`` under a lock of the node;
    the database enforces the sharing part itself (``GpuClaim``).
    """
    if (
        not isinstance(gpu_indexes, list)
        or not gpu_indexes
        or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in gpu_indexes)
    ):
        return "gpu_indexes must be a non-empty list of GPU indexes, e.g. [0, 1]"
    if len(set(gpu_indexes)) != len(gpu_indexes):
        return "gpu_indexes names a GPU twice"
    if node is None:
        return ""
    present = set(node.gpus.values_list("index", flat=True))
    if not present:
        return f"node {node.name} has reported no GPUs yet: start its node worker first"
    missing = sorted(set(gpu_indexes) - present)
    if missing:
        return f"node {node.name} has no GPU {', '.join(map(str, missing))} (it has {sorted(present)})"
    others = Channel.objects.filter(node=node)
    if channel_id is not None:
        others = others.exclude(pk=channel_id)
    for other_name, other_gpus in others.values_list("name", "gpu_indexes"):
        shared = sorted(set(gpu_indexes) & set(other_gpus or []))
        if shared:
            return f"GPU {', '.join(map(str, shared))} of node {node.name} belongs to channel {other_name}"
    return ""


def validate_target(*, model: LLMModel | None, preset: Preset | None) -> None:
    """The one place of the rule that a preset belongs to its model."""
    if preset is not None and (model is None or preset.model_id != model.pk):
        owner = preset.model.name
        raise InvalidInput("preset", f"preset {preset.name!r} belongs to model {owner!r}, not to this model")
