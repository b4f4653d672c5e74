"""What channels should run and do run: overrides, targets, reload requests, runtimes, loads."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from channels_app.models.catalog import LLMModel, Preset
from channels_app.models.channel import Channel
from channels_app.models.machines import Node
from slotserve_base.target import Target
from slotserve_base.vocabulary import Phase, Reason


class Override(models.Model):
    """An admin's manual choice for a channel (docs/scheduling.md rule 4).

    Valid until ``until`` or until the next reservation starts, whichever is
    first; ``unload`` stops the process instead of naming a model.
    """

    channel = models.OneToOneField(Channel, on_delete=models.CASCADE, related_name="override")
    model = models.ForeignKey(LLMModel, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    preset = models.ForeignKey(Preset, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    unload = models.BooleanField(default=False)
    until = models.DateTimeField()
    set_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    set_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(Q(unload=True, model__isnull=True, preset__isnull=True))
                | Q(unload=False, model__isnull=False),
                name="override_model_xor_unload",
            ),
        ]

    def __str__(self) -> str:
        what = "unload" if self.unload else str(self.model)
        return f"{self.channel}: {what} until {self.until:%Y-%m-%d %H:%M}"

    @property
    def target(self) -> Target | None:
        if self.model_id is None:
            return None
        return Target(self.model_id, self.preset_id)


class OnDemandRelease(models.TextChoices):
    IDLE = "idle", "no request for the idle time"
    BOOKING = "booking", "a booking claimed the channel"
    FAILED = "failed", "it failed to load"
    STAFF = "staff", "released by staff"


class OnDemandLoad(models.Model):
    """A model loaded on a free channel because someone asked for it (docs/scheduling.md,
    "Loaded on demand"): the channel's target while it is active (rule 5), released when idle."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="on_demand_loads")
    model = models.ForeignKey(LLMModel, on_delete=models.CASCADE, related_name="on_demand_loads")
    preset = models.ForeignKey(Preset, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    started_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)
    released_why = models.CharField(max_length=10, choices=OnDemandRelease.choices, blank=True)

    class Meta:
        ordering = ["-started_at", "-pk"]
        indexes = [models.Index(fields=["requested_by", "started_at"], name="on_demand_by_when")]
        constraints = [
            # One load on demand a channel, and one a model, at a time.
            models.UniqueConstraint(
                fields=["channel"], condition=Q(released_at__isnull=True), name="on_demand_one_per_channel"
            ),
            models.UniqueConstraint(
                fields=["model"], condition=Q(released_at__isnull=True), name="on_demand_one_per_model"
            ),
            models.CheckConstraint(
                condition=Q(released_at__isnull=True, released_why="")
                | Q(released_at__isnull=False) & ~Q(released_why=""),
                name="on_demand_released_says_why",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.model} on {self.channel} for {self.requested_by} at {self.started_at:%Y-%m-%d %H:%M}"

    @property
    def target(self) -> Target:
        return Target(self.model_id, self.preset_id)


class LoadRecord(models.Model):
    """One load of a model + preset on a channel: its duration, or why it failed."""

    model = models.ForeignKey(LLMModel, on_delete=models.CASCADE, related_name="loads")
    preset = models.ForeignKey(Preset, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="loads")
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="loads")
    started = models.DateTimeField(default=timezone.now)
    finished = models.DateTimeField(null=True, blank=True)
    succeeded = models.BooleanField(null=True, help_text="None while loading.")
    error = models.TextField(blank=True)
    estimated_seconds = models.FloatField(
        null=True,
        blank=True,
        help_text="The estimate this load was planned with, before the node's margin: what its "
        "shortfall, the margin's lesson, is measured against (docs/scheduling.md).",
    )

    class Meta:
        ordering = ["-started"]
        constraints = [
            models.CheckConstraint(
                condition=Q(finished__isnull=True) | Q(finished__gte=models.F("started")),
                name="load_finished_after_started",
            ),
        ]
        indexes = [
            # The load estimate: last 5 successful loads of a model + preset on a node.
            models.Index(
                fields=["model", "preset", "node", "-finished"],
                name="load_recent_success_idx",
                condition=Q(succeeded=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.model} on {self.channel} at {self.started:%Y-%m-%d %H:%M}"

    @property
    def duration_seconds(self) -> float | None:
        if self.finished is None:
            return None
        return (self.finished - self.started).total_seconds()


class ChannelTarget(models.Model):
    """What the scheduler decided a channel should run. Written by the scheduler only."""

    channel = models.OneToOneField(Channel, on_delete=models.CASCADE, primary_key=True, related_name="target")
    model = models.ForeignKey(LLMModel, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    preset = models.ForeignKey(Preset, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    reason = models.CharField(max_length=40, choices=Reason.choices)
    valid_until = models.DateTimeField(null=True, blank=True)
    reservation = models.ForeignKey(
        "reservations.Reservation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.channel_id}: {self.model_id}/{self.preset_id} ({self.reason})"


class ReloadRequest(models.Model):
    """Staff asked to restart a channel's process at once, without draining (docs/scheduling.md).

    A fact of its own, written by ``channel_reload`` only: each request raises the
    generation, and the node worker restarts the process when it sees a generation it
    has not run yet.
    """

    channel = models.OneToOneField(Channel, on_delete=models.CASCADE, primary_key=True, related_name="reload")
    generation = models.PositiveIntegerField(default=0)
    requested_at = models.DateTimeField(default=timezone.now)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return f"reload {self.generation} of {self.channel_id}"


class ChannelRuntime(models.Model):
    """What actually runs on a channel. Written by the channel's node worker only."""

    channel = models.OneToOneField(
        Channel, on_delete=models.CASCADE, primary_key=True, related_name="runtime"
    )
    phase = models.CharField(max_length=20, choices=Phase.choices, default=Phase.STOPPED)
    model = models.ForeignKey(LLMModel, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    preset = models.ForeignKey(Preset, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    since = models.DateTimeField(default=timezone.now)
    error = models.TextField(blank=True)
    retry_at = models.DateTimeField(null=True, blank=True)
    fallback = models.BooleanField(default=False)
    # The current run, so that a restarted worker can find and adopt it.
    run_id = models.CharField(max_length=32, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    host = models.CharField(max_length=255, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    # The run's own API key (docs/security.md): the gateway sends it upstream; shown nowhere.
    api_secret = models.CharField(max_length=100, blank=True, editable=False)
    log_path = models.CharField(max_length=1000, blank=True)
    load = models.ForeignKey("LoadRecord", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    stop_sent_at = models.DateTimeField(null=True, blank=True)
    kill_sent = models.BooleanField(default=False)
    failing = models.BooleanField(default=False)
    reload_generation = models.PositiveIntegerField(default=0)
    # What the running process was started with (backend, path, effective arguments), digested:
    # a preset or model edited since makes it another target (``slotserve_base.target``).
    fingerprint = models.CharField(max_length=40, blank=True)
    # The last failed target and its retries (docs/scheduling.md "Retries").
    failed_model = models.ForeignKey(
        LLMModel, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    failed_preset = models.ForeignKey(
        Preset, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    failed_fingerprint = models.CharField(max_length=40, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    failure_error = models.TextField(blank=True)
    fallback_failed = models.BooleanField(default=False)
    # The failure episode: what its target was wanted for, and since when it fails.
    failure_purpose = models.CharField(max_length=60, blank=True)
    failure_began = models.DateTimeField(null=True, blank=True)
    # Requests the ready process serves at once (docs/gateway.md "Fair sharing under contention");
    # None while it is not ready, or when nothing tells.
    places = models.PositiveIntegerField(null=True, blank=True)
    # The channel's sleeping process (docs/scheduling.md, "Sleep and wake"): its run, pid, host,
    # port, secret, log and target, kept to be woken for its next turn; null when none sleeps.
    asleep = models.JSONField(null=True, blank=True, editable=False)
    sleeping_out = models.BooleanField(default=False)  # stopping by putting the process to sleep
    waking = models.BooleanField(default=False)  # loading by waking the sleeper

    def __str__(self) -> str:
        return f"{self.channel_id}: {self.phase}"

    @property
    def running(self) -> Target | None:
        """The target the process runs or is loading, as the decision sees it."""
        if self.model_id is None or self.phase not in {Phase.LOADING, Phase.READY}:
            return None
        return Target(self.model_id, self.preset_id)
