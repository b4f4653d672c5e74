"""Channels: the bookable GPUs of a node, and which GPUs each claims."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from channels_app.models.catalog import LLMModel, Preset
from channels_app.models.machines import Node
from slotserve_base.target import Target

if TYPE_CHECKING:
    from channels_app.models.state import ChannelRuntime, ChannelTarget


class ApprovalPolicy(models.TextChoices):
    NONE = "none", "No approval"
    EXCLUSIVE_ONLY = "exclusive_only", "Whole-card bookings need approval"
    ALL = "all", "Every booking needs approval"


# What staff set on a channel, in the admin and through the API alike (the API adds its id and
# what it reads of the channel's state): one list for both.
CHANNEL_SETTINGS = (
    "name",
    "node",
    "gpu_indexes",
    "approval_policy",
    "default_model",
    "default_preset",
    "labels",
    "allow_whole_card",
    "min_booking_minutes",
    "max_booking_minutes",
    "max_days_ahead",
    "weekly_quota_hours",
    "allowed_groups",
    "group_weekly_quota_hours",
    "idle_warn_minutes",
    "idle_release_minutes",
    "lend_while_idle",
    "serves_on_demand",
)


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
    lend_while_idle = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Lend booked time to others while the booker is idle: where the booker allows it, "
        "others may call the booked model between the booker's requests, and the booker's requests "
        'end theirs when every place is taken (docs/gateway.md, "Lending").',
    )
    serves_on_demand = models.BooleanField(
        default=True,
        db_default=True,
        help_text="A request for a model no channel runs may load it here while the channel is free "
        '(docs/scheduling.md, "Loaded on demand").',
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


def channels_bookable_by(user: Any) -> models.QuerySet[Channel]:
    """The channels ``user`` may book: staff every one; others those kept for no group, or for a
    group of theirs (the rule ``reservation_create`` enforces, docs/portal.md, "Groups")."""
    if user.is_staff:
        return Channel.objects.all()
    open_or_theirs = models.Q(allowed_groups__isnull=True) | models.Q(allowed_groups__in=user.groups.all())
    return Channel.objects.filter(pk__in=Channel.objects.filter(open_or_theirs).values("pk"))
