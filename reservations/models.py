"""Reservations of channels, and the notifications SlotServe sends about them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import RangeOperators
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Func, Q
from django.utils import timezone

from slotserve_base.target import Target
from slotserve_base.vocabulary import NotificationEvent

# The longest reason an approver may give for a rejection (portal, API and admin alike).
REJECT_REASON_MOST = 2000


class ReservationStatus(models.TextChoices):
    """A reservation's state. Allowed transitions:

    pending  → approved | rejected | cancelled
    approved → cancelled (before it starts) | ended (while active, end = now)
    rejected, cancelled, ended: final.
    """

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    ENDED = "ended"


# Statuses that hold a slot: no two of them may overlap on one channel (docs/scheduling.md).
BLOCKING_STATUSES = (ReservationStatus.PENDING, ReservationStatus.APPROVED)
# Statuses that made or make the channel busy: an ended reservation ran [start, end).
SCHEDULED_STATUSES = (ReservationStatus.APPROVED, ReservationStatus.ENDED)


class TsTzRange(Func):
    function = "TSTZRANGE"
    output_field: Any = models.DateTimeField()  # only used inside the constraint's SQL


class PostgresOnlyExclusionConstraint(ExclusionConstraint):
    """An exclusion constraint created on PostgreSQL and skipped elsewhere.

    On SQLite the same rule is kept by checking for overlaps and inserting in
    one ``BEGIN IMMEDIATE`` transaction (``reservations.services``).
    """

    def _on_postgres(self, schema_editor: Any) -> bool:
        return bool(schema_editor.connection.vendor == "postgresql")

    def constraint_sql(self, model: Any, schema_editor: Any) -> Any:
        return super().constraint_sql(model, schema_editor) if self._on_postgres(schema_editor) else None

    def create_sql(self, model: Any, schema_editor: Any) -> Any:
        return super().create_sql(model, schema_editor) if self._on_postgres(schema_editor) else None

    def remove_sql(self, model: Any, schema_editor: Any) -> Any:
        return super().remove_sql(model, schema_editor) if self._on_postgres(schema_editor) else None

    def validate(self, model: Any, instance: Any, exclude: Any = None, using: str = "default") -> None:
        # The service layer checks overlaps with a message naming the slot.
        return None


class ReservationQuerySet(models.QuerySet["Reservation"]):
    def blocking(self) -> ReservationQuerySet:
        """Reservations that hold their slot: pending or approved."""
        return self.filter(status__in=BLOCKING_STATUSES)

    def scheduled(self) -> ReservationQuerySet:
        """Reservations that make a channel busy: approved, or ended early."""
        return self.filter(status__in=SCHEDULED_STATUSES)

    def overlapping(self, start: datetime, end: datetime) -> ReservationQuerySet:
        """Reservations sharing any moment with ``[start, end)``; back to back is fine."""
        return self.filter(start__lt=end, end__gt=start)

    def active_at(self, now: datetime) -> ReservationQuerySet:
        return self.scheduled().filter(start__lte=now, end__gt=now)


class Reservation(models.Model):
    """A booking of one channel for ``[start, end)`` by one user.

    Either a model + preset, or whole-card (``exclusive``: no inference
    process at all, the user gets the raw GPUs).
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="reservations")
    channel = models.ForeignKey("channels_app.Channel", on_delete=models.CASCADE, related_name="reservations")
    start = models.DateTimeField()
    end = models.DateTimeField()
    model = models.ForeignKey(
        "channels_app.LLMModel", null=True, blank=True, on_delete=models.PROTECT, related_name="reservations"
    )
    preset = models.ForeignKey(
        "channels_app.Preset", null=True, blank=True, on_delete=models.PROTECT, related_name="reservations"
    )
    exclusive = models.BooleanField(default=False, help_text="Whole-card: no inference process.")
    lend = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Others may call the booked model while the booker is idle (where the channel lends).",
    )
    status = models.CharField(
        max_length=20, choices=ReservationStatus.choices, default=ReservationStatus.PENDING
    )
    reject_reason = models.TextField(blank=True)  # at most REJECT_REASON_MOST characters
    note = models.TextField(blank=True)
    created = models.DateTimeField(default=timezone.now)
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reviewed_at = models.DateTimeField(null=True, blank=True)
    # An extension of an approved reservation that waits for approval: the time it adds,
    # right after the reservation it extends (reservations.services.reservation_extend).
    extends = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="extensions"
    )
    series = models.ForeignKey(
        "ReservationSeries", null=True, blank=True, on_delete=models.SET_NULL, related_name="reservations"
    )
    # The channel's idle rule at work (reservations.idle): when the booker was warned that no
    # request had reached the booking, and when the rest of it was released unused.
    idle_warned_at = models.DateTimeField(null=True, blank=True)
    released_idle_at = models.DateTimeField(null=True, blank=True)
    # Gateway usage during the reservation, copied from Redis by the tick.
    requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)

    objects = ReservationQuerySet.as_manager()

    class Meta:
        ordering = ["start"]
        constraints = [
            models.CheckConstraint(
                condition=Q(end__gt=models.F("start")), name="reservation_end_after_start"
            ),
            models.CheckConstraint(
                condition=Q(exclusive=True, model__isnull=True, preset__isnull=True)
                | Q(exclusive=False, model__isnull=False),
                name="reservation_model_xor_exclusive",
            ),
            models.CheckConstraint(
                condition=Q(exclusive=False) | Q(lend=False), name="reservation_no_whole_card_lent"
            ),
            PostgresOnlyExclusionConstraint(
                name="reservation_no_overlap",
                expressions=[
                    (TsTzRange("start", "end", models.Value("[)")), RangeOperators.OVERLAPS),
                    ("channel", RangeOperators.EQUAL),
                ],
                condition=Q(status__in=BLOCKING_STATUSES),
            ),
        ]
        indexes = [
            # The tick's "latest started" and "next" reservation per channel, and
            # the overlap check: channel = ? AND start < ? ORDER BY start.
            models.Index(fields=["channel", "start"], name="reservation_channel_start_idx"),
            # "My reservations": user = ? ORDER BY start.
            models.Index(fields=["user", "start"], name="reservation_user_start_idx"),
            # What waits for approval (every page's count, the Approvals list, nearest first):
            # the pending ones only, a few among a year of bookings.
            models.Index(fields=["start"], name="reservation_pending_idx", condition=Q(status="pending")),
            # Every booking in time order, a page at a time (staff's REST list: ORDER BY start, id
            # LIMIT 100 read a year of bookings to sort them), and the calendars' days.
            models.Index(fields=["start", "id"], name="reservation_start_id_idx"),
        ]

    def __str__(self) -> str:
        # UTC, said so: the text is kept (the audit trail's, the admin's) for any reader.
        start, end = self.start.astimezone(UTC), self.end.astimezone(UTC)
        return f"{self.channel} {start:%Y-%m-%d %H:%M}–{end:%H:%M} UTC ({self.status})"

    @property
    def target(self) -> Target | None:
        if self.exclusive or self.model_id is None:
            return None
        return Target(self.model_id, self.preset_id)

    def is_active(self, now: datetime) -> bool:
        return self.status == ReservationStatus.APPROVED and self.start <= now < self.end

    @property
    def what(self) -> str:
        """``qwen / chat``, ``qwen``, or ``the whole card``."""
        if self.exclusive or self.model is None:
            return "the whole card"
        return f"{self.model.name} / {self.preset.name}" if self.preset else self.model.name


class GroupPolicy(models.Model):
    """What SlotServe adds to a Django group: who approves its members' bookings."""

    group = models.OneToOneField("auth.Group", on_delete=models.CASCADE, related_name="policy")
    approvers = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        blank=True,
        related_name="approves_for",
        help_text="They receive and decide the group's booking requests (staff always may).",
    )
    share_weight = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Members' share when a channel is busy: a weight of 2 gets twice the tokens of a "
        "weight of 1 from the channel's fair queue (a member of several groups has the largest).",
    )
    loads_on_demand = models.BooleanField(
        default=True,
        db_default=True,
        help_text="Members' requests may load a model no channel runs on a free channel; off for a "
        "member of any group that turns it off.",
    )

    class Meta:
        verbose_name_plural = "group policies"
        constraints = [
            models.CheckConstraint(
                condition=Q(share_weight__range=(1, 100)), name="group_share_weight_in_range"
            ),
        ]

    def __str__(self) -> str:
        return f"policy of {self.group}"


class ReservationSeries(models.Model):
    """Recurring bookings made together (``reservations.recurrence``): each occurrence is a
    reservation of its own, cancelled one by one or all at once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="series")
    channel = models.ForeignKey("channels_app.Channel", on_delete=models.CASCADE, related_name="series")
    repeat = models.CharField(
        max_length=16,
        choices=[(r, r) for r in ("daily", "weekdays", "weekly", "monthly", "monthly_weekday")],
    )
    until = models.DateField(null=True, blank=True)
    count = models.PositiveSmallIntegerField(null=True, blank=True)
    every = models.PositiveSmallIntegerField(default=1, help_text="Every this many days, weeks or months.")
    # A weekly series' days besides its first slot's: 0 Monday … 6 Sunday.
    on_days = models.JSONField(default=list, blank=True)
    time_zone = models.CharField(max_length=64, help_text="The zone whose wall-clock times the series keeps.")
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "reservation series"

    def __str__(self) -> str:
        return f"{self.repeat} on {self.channel} for {self.user}"


class WaitlistEntry(models.Model):
    """ "Tell me when this slot frees": the user is notified once, when a cancellation, an early
    end, a rejection or a change leaves all of ``[start, end)`` free (``reservations.services.waitlist``)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="waitlist")
    channel = models.ForeignKey("channels_app.Channel", on_delete=models.CASCADE, related_name="waitlist")
    start = models.DateTimeField()
    end = models.DateTimeField()
    created = models.DateTimeField(default=timezone.now)
    notified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created"]
        verbose_name_plural = "waitlist entries"
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=models.F("start")), name="waitlist_end_after_start"),
            models.UniqueConstraint(
                fields=["user", "channel", "start", "end"],
                condition=Q(notified_at__isnull=True),
                name="waitlist_once_per_slot",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} waits for {self.channel} {self.start:%Y-%m-%d %H:%M}"


class Notification(models.Model):
    """An in-app notification; ``key`` makes an event be sent once per user."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    event = models.CharField(max_length=40, choices=NotificationEvent.choices)
    text = models.TextField()
    link = models.CharField(max_length=500, blank=True)
    key = models.CharField(max_length=200, null=True, blank=True)
    read = models.BooleanField(default=False)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "key"], condition=Q(key__isnull=False), name="notification_once_per_key"
            ),
        ]
        indexes = [
            # The inbox and its unread count: user = ? [AND read = false] ORDER BY created DESC.
            models.Index(fields=["user", "read", "-created"], name="notification_inbox_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.user}: {self.event}"


def _calendar_token() -> str:
    import secrets

    return secrets.token_urlsafe(24)


WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


class Profile(models.Model):
    """A user's own settings: time zone, email preferences, calendar feed token."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="profile")
    time_zone = models.CharField(max_length=64, default="UTC")
    # Whether the zone was chosen (by the user, or detected from their browser at first sign-in);
    # until then pages show UTC and the browser's zone is taken at the next page.
    time_zone_chosen = models.BooleanField(default=False)
    # Event kind → whether to email it; kinds not listed are emailed.
    email_events = models.JSONField(default=dict, blank=True)
    calendar_token = models.CharField(max_length=64, unique=True, default=_calendar_token)
    # The day the calendar's week begins on: 0 Monday … 6 Sunday.
    week_start = models.PositiveSmallIntegerField(
        default=0,
        choices=list(enumerate(WEEKDAYS)),
    )
    # Gateway usage, all time, copied from Redis by the tick.
    requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(week_start__lte=6), name="profile_week_start_a_weekday")
        ]

    def __str__(self) -> str:
        return f"profile of {self.user}"

    def wants_email(self, event: str) -> bool:
        return bool(self.email_events.get(event, True))


# What staff keep for the whole lab: blackouts, bulletins, invitations and sign-ups.
from reservations.lab_models import (  # noqa: E402  (after the models they sit beside)
    BLACKOUT_REASON_MOST as BLACKOUT_REASON_MOST,
)
from reservations.lab_models import BULLETIN_MOST as BULLETIN_MOST  # noqa: E402
from reservations.lab_models import Blackout as Blackout  # noqa: E402
from reservations.lab_models import Bulletin as Bulletin  # noqa: E402
from reservations.lab_models import Invitation as Invitation  # noqa: E402
from reservations.lab_models import SignupRequest as SignupRequest  # noqa: E402
