"""Webhooks: where a user's or staff's events go, and the log of what was sent
(docs/webhooks.md)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class Scope(models.TextChoices):
    MINE = "mine", "My bookings and keys"
    ALL = "all", "Everyone's (staff)"


class Body(models.TextChoices):
    STANDARD = "standard", "JSON, signed as Standard Webhooks says"
    SLACK = "slack", 'Slack-compatible {"text": …} (Slack, Mattermost, Rocket.Chat)'


# What a webhook is, as its owner and staff read it (the API adds its id and secret; the admin
# shows these read-only): one list for both.
WEBHOOK_SHOWN = (
    "name",
    "url",
    "events",
    "scope",
    "channels",
    "body",
    "created",
    "paused_at",
    "paused_reason",
)


class Webhook(models.Model):
    """A URL that hears of events: its owner's own (``mine``), or, for staff, everyone's, of every
    channel or of the chosen ones. Signed with ``secret`` (``whsec_…``)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhooks")
    name = models.CharField(max_length=100, blank=True)
    url = models.URLField(max_length=2000)
    secret = models.CharField(max_length=100)
    events = models.JSONField(
        default=list, blank=True, help_text="The event types it hears of; empty: every event."
    )
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.MINE)
    channels = models.ManyToManyField(
        "channels_app.Channel",
        blank=True,
        related_name="+",
        help_text="For everyone's events: only these channels' (empty: every channel, and the nodes).",
    )
    body = models.CharField(max_length=10, choices=Body.choices, default=Body.STANDARD)
    created = models.DateTimeField(default=timezone.now)
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_reason = models.TextField(blank=True)
    # A deliverer's claim (``delivery.deliver``): one at a time per webhook, so its events
    # leave in order and none twice.
    lease_until = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["owner", "pk"]
        constraints = [
            models.CheckConstraint(condition=Q(scope__in=Scope.values), name="webhook_scope_known"),
            models.CheckConstraint(condition=Q(body__in=Body.values), name="webhook_body_known"),
        ]

    def __str__(self) -> str:
        return self.name or self.url


class Event(models.Model):
    """One happening (``slotserve_base.happenings``), kept for the delivery log; ``msg_id`` is the
    ``webhook-id`` every delivery of it carries, the same on each try."""

    msg_id = models.CharField(max_length=40, unique=True)
    type = models.CharField(max_length=40)
    at = models.DateTimeField()
    data = models.JSONField(default=dict)
    subject = models.CharField(max_length=60, help_text="The object whose events keep their order.")
    key = models.CharField(max_length=120, null=True, blank=True, unique=True)

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["at"], name="webhook_event_at")]

    def __str__(self) -> str:
        return f"{self.type} {self.msg_id}"


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Waiting to be sent, or for its next try"
    DELIVERED = "delivered", "Answered with a 2xx"
    FAILED = "failed", "Given up after its last try"


class Delivery(models.Model):
    """One event for one webhook: the body sent on every try, and when the next try is due."""

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries")
    body = models.TextField()
    state = models.CharField(max_length=10, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    tries = models.PositiveSmallIntegerField(default=0)
    next_try_at = models.DateTimeField()
    created = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    redelivery_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="redeliveries"
    )

    class Meta:
        ordering = ["-pk"]
        verbose_name_plural = "deliveries"
        indexes = [
            models.Index(
                fields=["webhook", "next_try_at"],
                condition=Q(state="pending"),
                name="webhook_delivery_pending",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=DeliveryState.values), name="webhook_delivery_state_known"
            ),
            models.CheckConstraint(
                condition=Q(state="delivered", delivered_at__isnull=False)
                | (~Q(state="delivered") & Q(delivered_at__isnull=True)),
                name="webhook_delivered_has_moment",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event} → {self.webhook} ({self.state})"


class DeliveryTry(models.Model):
    """One try of a delivery: the receiver's status (none when it could not be reached), how long
    it took, the first bytes of its answer or what went wrong."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempts")
    at = models.DateTimeField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    duration_ms = models.FloatField()
    answer = models.TextField(blank=True, help_text="The answer's first bytes.")
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["delivery", "at", "pk"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.status_code or self.error}"
