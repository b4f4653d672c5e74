"""What staff keep for the whole lab, beside the bookings: blackouts that close channels,
bulletins on the overview, invitations and sign-ups (docs/portal.md)."""

from __future__ import annotations

from datetime import UTC

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

# The longest reason a blackout gives (a refusal and the calendar quote it whole).
BLACKOUT_REASON_MOST = 300


class Blackout(models.Model):
    """A time the lab keeps channels closed, for maintenance or an event of its own: no booking
    may overlap it, staff's neither; its reason is quoted by every refusal and the calendar
    (``reservations.services.blackouts``). No channels named: every channel."""

    channels = models.ManyToManyField(
        "channels_app.Channel", blank=True, related_name="blackouts", help_text="None chosen: every channel."
    )
    start = models.DateTimeField()
    end = models.DateTimeField()
    reason = models.CharField(max_length=BLACKOUT_REASON_MOST)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["start"]
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=models.F("start")), name="blackout_end_after_start"),
            models.CheckConstraint(condition=~Q(reason=""), name="blackout_says_why"),
        ]
        indexes = [models.Index(fields=["end", "start"], name="blackout_end_start_idx")]

    def __str__(self) -> str:
        start, end = self.start.astimezone(UTC), self.end.astimezone(UTC)
        return f"blackout {start:%Y-%m-%d %H:%M}–{end:%Y-%m-%d %H:%M} UTC: {self.reason}"


# The longest bulletin: a paragraph on the overview, not a page.
BULLETIN_MOST = 2000


class Bulletin(models.Model):
    """A line from staff on everyone's overview (``reservations.services.bulletins``), shown
    from ``shown_from`` until ``shown_until`` (none: until it is taken down)."""

    text = models.TextField(max_length=BULLETIN_MOST)
    shown_from = models.DateTimeField(default=timezone.now)
    shown_until = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-shown_from"]
        constraints = [
            models.CheckConstraint(
                condition=Q(shown_until__isnull=True) | Q(shown_until__gt=models.F("shown_from")),
                name="bulletin_ends_after_it_begins",
            ),
            models.CheckConstraint(condition=~Q(text=""), name="bulletin_says_something"),
        ]

    def __str__(self) -> str:
        return self.text if len(self.text) <= 60 else self.text[:59] + "…"


class Invitation(models.Model):
    """Staff ask someone to join by email (``reservations.joining``): the link's token is kept
    hashed, works once, until ``expires_at``, and the account it makes joins ``groups``."""

    email = models.EmailField()
    token_hash = models.CharField(max_length=64, unique=True)
    groups = models.ManyToManyField("auth.Group", blank=True, related_name="+")
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    accepted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"invitation of {self.email}"


class SignupRequest(models.Model):
    """Someone asked for an account on the sign-up page (``SLOTSERVE_SIGNUP``): the account waits
    inactive until its email is confirmed, and, where staff approve sign-ups, until they do."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="signup")
    token_hash = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(default=timezone.now)
    email_confirmed_at = models.DateTimeField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    def __str__(self) -> str:
        return f"sign-up of {self.user}"
