"""A channel's story (docs/scheduling.md, "A channel's story"): what happened to it, one row per
happening, kept ``SLOTSERVE_STORY_DAYS`` days.

The rows hold facts (names, reasons, moments, errors) and no sentences: the story is told in the
reader's words and time zone when it is read (``portal.story``). Bookings, the queue and
the requests served are not kept here; they are read from their own tables.
"""

from __future__ import annotations

from django.db import models

from channels_app.models.channel import Channel


class StoryKind(models.TextChoices):
    DECIDED = "decided", "The scheduler chose what the channel should run"
    OVERRIDE_SET = "override_set", "An admin set an override"
    OVERRIDE_CLEARED = "override_cleared", "An admin cleared the override"
    RELOAD = "reload", "An admin asked for a reload"
    LOADING = "loading", "A load began"
    READY = "ready", "The model is ready"
    FAILED = "failed", "The model failed to load or died"
    FALLBACK = "fallback", "The default model serves the booking meanwhile"
    RECOVERED = "recovered", "The booked model serves again"
    SWITCHED = "switched", "The channel serves another model than before"
    DRAINING = "draining", "Requests in flight finish before a switch"
    STOPPING = "stopping", "The process was asked to stop"
    STOPPED = "stopped", "The process has stopped"
    NODE_NOT_READY = "node_not_ready", "The node's worker stopped reporting"
    NODE_READY = "node_ready", "The node's worker reports again"
    PREWARMED = "prewarmed", "The next booking's model file was read into memory"
    ON_DEMAND = "on_demand", "A request loaded a model on the free channel"
    ON_DEMAND_RELEASED = "on_demand_freed", "A model loaded on demand was released"


class StoryEntry(models.Model):
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="story")
    at = models.DateTimeField()
    kind = models.CharField(max_length=20, choices=StoryKind.choices)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "pk"]
        verbose_name_plural = "story entries"
        indexes = [models.Index(fields=["channel", "at"], name="story_channel_at")]
        constraints = [
            models.CheckConstraint(condition=models.Q(kind__in=StoryKind.values), name="story_kind_known")
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.channel_id} {self.kind}"
