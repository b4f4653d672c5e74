"""API keys: one secret per script or client, valid for the REST API and the gateway."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

KEY_PREFIX = "ss-"


def hash_key(key: str) -> str:
    # Keys are 256-bit random tokens, so a fast hash is enough: there is no
    # dictionary to attack, and the gateway checks a key on every request.
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class ApiKeyQuerySet(models.QuerySet["ApiKey"]):
    def usable(self, now: datetime | None = None) -> ApiKeyQuerySet:
        """Keys that open the gateway and the API now: not revoked, not expired, of an active user."""
        moment = now or timezone.now()
        return self.filter(revoked_at__isnull=True, user__is_active=True).filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=moment)
        )

    def live(self) -> ApiKeyQuerySet:
        """Keys not revoked, of an active user, expired or not (an expired one is told so)."""
        return self.filter(revoked_at__isnull=True, user__is_active=True)


class ApiKey(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, help_text="The first characters, to recognise the key.")
    hashed = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(default=timezone.now)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    max_concurrent = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests this key may have in flight at once (empty: no own limit)."
    )
    requests_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests this key may start per minute (empty: no own limit)."
    )
    weekly_tokens = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Tokens this key may use a week outside its person's own slots (empty: no own limit).",
    )
    # A key's scope (docs/api.md, "Keys scoped like a team's keys"): none set means all.
    models_allowed = models.ManyToManyField(
        "channels_app.LLMModel",
        blank=True,
        related_name="+",
        help_text="The models (and their aliases) this key may call through the gateway; none: all.",
    )
    channels_allowed = models.ManyToManyField(
        "channels_app.Channel",
        blank=True,
        related_name="+",
        help_text="The channels this key may reach through the gateway; none: all.",
    )
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="When the key stops working (its owner is told a week ahead)."
    )
    expiry_told_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When its owner was told it expires soon."
    )
    read_only = models.BooleanField(
        default=False, help_text="For the REST API: it may read, never change (e.g. a dashboard's key)."
    )
    wait_seconds = models.PositiveIntegerField(
        default=0,
        help_text="How long the gateway holds this key's requests while their model loads or the "
        "channel switches, instead of answering 503 at once (the X-SlotServe-Wait header overrides).",
    )
    # Made by the portal's playground for one sitting (``gateway.api_keys.playground_key``): it
    # lasts an hour, the keys page does not list it and nobody is told it expires.
    playground = models.BooleanField(default=False)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]
        verbose_name = "API key"
        constraints = [
            models.CheckConstraint(condition=~Q(name=""), name="apikey_name_not_empty"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class RequestLog(models.Model):
    """One request through the gateway: who, with which key, to which channel and model, how it
    ended and how long it took. Written in batches from Redis by ``flush_gateway_usage``; kept
    ``SLOTSERVE_REQUEST_LOG_DAYS`` days."""

    at = models.DateTimeField(help_text="When the request arrived.")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="requests")
    key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="requests")
    channel = models.ForeignKey(
        "channels_app.Channel", null=True, blank=True, on_delete=models.SET_NULL, related_name="requests"
    )
    reservation = models.ForeignKey(
        "reservations.Reservation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    model = models.CharField(max_length=200, blank=True, help_text="The model the request named.")
    served_model = models.CharField(
        max_length=200, blank=True, default="", help_text="The model that served it (the channel's, by name)."
    )
    method = models.CharField(max_length=10, default="POST")
    path = models.CharField(max_length=300)
    status = models.PositiveSmallIntegerField()
    ttft_ms = models.FloatField(null=True, blank=True, help_text="Time to the first byte of the answer.")
    duration_ms = models.FloatField()
    queued_ms = models.FloatField(
        null=True, blank=True, help_text="Time it waited in the channel's fair queue (empty: no wait)."
    )
    decided_ms = models.FloatField(
        null=True,
        blank=True,
        help_text="When the gateway decided where it goes and whether it may, after its arrival: it may "
        "have waited for the gateway's snapshot, for a loading model or for its turn (the access rules "
        "hold at that moment).",
    )
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    error_code = models.CharField(
        max_length=40,
        blank=True,
        default="",
        help_text="A refused request's code, as the caller got it (gpu_reserved, rate_limit_exceeded…).",
    )
    error = models.CharField(
        max_length=300, blank=True, default="", help_text="A refused request's reason, as the caller got it."
    )
    request_id = models.CharField(
        max_length=40,
        blank=True,
        default="",
        help_text="The gateway's id of the request: a record that reaches the log twice is one row.",
    )
    borrowed = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Served in someone else's slot, lent while its booker was idle.",
    )

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [
            models.Index(fields=["user", "-at"], name="requestlog_user_at"),
            models.Index(fields=["-at"], name="requestlog_at"),
            # The few borrowed requests, for usage's "borrowed" and "lent" (docs/gateway.md).
            models.Index(fields=["at"], condition=models.Q(borrowed=True), name="requestlog_borrowed_at"),
        ]
        constraints = [
            # A count out sent again after its reply was lost, or a batch written but not taken
            # off Redis, brings the same record twice (gateway.usage.request_log).
            models.UniqueConstraint(
                fields=["request_id"], condition=~models.Q(request_id=""), name="requestlog_request_once"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.method} {self.path} {self.status}"


class SharingLimits(models.Model):
    """One user's own limits outside their slots, instead of the installation's
    (``SLOTSERVE_LIMIT_*``). Empty: the setting; 0: no limit."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sharing_limits"
    )
    max_concurrent = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests in flight at once."
    )
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    weekly_tokens = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Prompt and completion tokens per week (Monday 00:00 UTC on)."
    )

    class Meta:
        verbose_name = "sharing limits"
        verbose_name_plural = "sharing limits"

    def __str__(self) -> str:
        return f"limits of {self.user}"


class RequestSums(models.Model):
    """What a roll-up sums of its requests."""

    requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    ttft_ms_sum = models.FloatField(default=0.0)
    ttft_count = models.PositiveIntegerField(default=0)

    class Meta:
        abstract = True


class RequestHour(RequestSums):
    """The request log summed per hour, user and channel (``gateway.usage.rollups``): what usage
    reads for whole hours instead of every request. Kept past the log's own rows."""

    hour = models.DateTimeField(help_text="The hour's start (UTC).")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    channel = models.ForeignKey(
        "channels_app.Channel", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["hour", "user", "channel"], name="requesthour_once"),
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}:00 user {self.user_id} channel {self.channel_id}: {self.requests}"


class RequestDay(RequestSums):
    """The request log summed per day (UTC) and user, and per day and channel
    (``gateway.usage.rollups``): what usage reads for whole days, a week's report a few thousand
    rows whatever the lab's size. Kept past the log's own rows."""

    PER = [("user", "user"), ("channel", "channel")]

    day = models.DateField(help_text="The day (UTC).")
    per = models.CharField(max_length=8, choices=PER, help_text="Summed per user or per channel.")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    channel = models.ForeignKey(
        "channels_app.Channel", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["day", "per", "user", "channel"], name="requestday_once"),
            models.CheckConstraint(
                condition=Q(per="user", user__isnull=False, channel__isnull=True)
                | Q(per="channel", user__isnull=True),
                name="requestday_per_user_or_channel",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.per} {self.user_id or self.channel_id}: {self.requests}"


class MinutesOf(models.Model):
    """Whose minutes a minutes roll-up holds: a channel's, in a booking (with its booker) or
    outside bookings."""

    channel = models.ForeignKey(
        "channels_app.Channel", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reservation = models.ForeignKey(
        "reservations.Reservation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        help_text="The booker, for a booking's minutes.",
    )

    class Meta:
        abstract = True


class RequestMinutes(MinutesOf):
    """The minutes of one hour that a channel's requests touched, as bits (bit i: minute i of
    the hour), per booking (and one row for the requests outside bookings): what usage reads to
    count used and served minutes (``gateway.usage.rollups``)."""

    hour = models.IntegerField(help_text="Hours since the epoch (1970-01-01 00:00 UTC).")
    minutes = models.BigIntegerField(help_text="Bit i set: minute i of the hour was touched.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["hour", "channel", "reservation"], name="requestminutes_once"),
            models.CheckConstraint(
                condition=Q(minutes__gt=0, minutes__lt=2**60), name="requestminutes_of_the_hour"
            ),
        ]
        indexes = [models.Index(fields=["hour"], name="requestminutes_hour")]

    def __str__(self) -> str:
        return f"hour {self.hour} channel {self.channel_id} booking {self.reservation_id}"


class RequestMinutesDay(MinutesOf):
    """``RequestMinutes`` for a whole day (UTC): bit i of ``minutes`` (little-endian bytes) is
    minute i of the day. What a week's report reads: a row per channel and day, and per booking."""

    day = models.DateField(help_text="The day (UTC).")
    minutes = models.BinaryField(max_length=180, help_text="1,440 bits, little-endian: the day's minutes.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["day", "channel", "reservation"], name="requestminutesday_once"),
        ]

    def __str__(self) -> str:
        return f"{self.day} channel {self.channel_id} booking {self.reservation_id}"


class RollupMark(models.Model):
    """How far the roll-ups have read the request log (one row), locked while they are written."""

    last_id = models.BigIntegerField(default=0)
    locked_at = models.DateTimeField(null=True, blank=True)
    # The backlog: rows written past the mark in a mass (a restore, an import), set aside for the
    # catch-up task, which folds them in hour order. Those of ``(backlog_from, backlog_to]`` that
    # arrived at or after ``backlog_hour`` are not folded yet; none, when ``backlog_to`` is 0.
    backlog_from = models.BigIntegerField(default=0)
    backlog_to = models.BigIntegerField(default=0)
    backlog_hour = models.DateTimeField(null=True, blank=True)
    backlog_until = models.DateTimeField(null=True, blank=True, help_text="Its last row's arrival.")
    backlog_rows = models.BigIntegerField(default=0)
    backlog_done = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"rolled up to request {self.last_id}"

    @property
    def catching_up(self) -> float | None:
        """How far the catch-up has come through the backlog (0 to 1), or None if there is none."""
        if not self.backlog_to:
            return None
        return min(self.backlog_done / max(self.backlog_rows, 1), 0.99)
