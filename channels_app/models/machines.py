"""The machines: GPU nodes and their GPUs, as their node workers report them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

if TYPE_CHECKING:
    pass


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
    # What the card is doing, as the node's heartbeat last saw it (NVML; a fake GPU reports what
    # its channel's processes use of the machine): None where the driver will not say.
    utilization_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    temperature_c = models.SmallIntegerField(null=True, blank=True)
    sampled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node"),
            models.CheckConstraint(condition=Q(memory_bytes__gte=0), name="gpu_memory_not_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}:{self.index} {self.name}"
