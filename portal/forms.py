"""Portal forms. They only collect input; the services decide and save."""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.models import Group
from django.utils.safestring import SafeString, mark_safe

from channels_app.models import Channel, LLMModel, Preset
from reservations.models import BLACKOUT_REASON_MOST, BULLETIN_MOST, WEEKDAYS
from reservations.recurrence import DAY_NAMES, MAX_EVERY, MAX_OCCURRENCES
from reservations.selectors import bookable_by
from reservations.webhooks.models import Body
from slotserve_base.vocabulary import NotificationEvent, WebhookEvent

LOCAL_INPUT = ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"]


class LocalDateTimeField(forms.DateTimeField):
    """A ``datetime-local`` input, read in the user's time zone (the active one)."""

    widget = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(input_formats=LOCAL_INPUT, **kwargs)


class BookableChannelField(forms.ModelChoiceField[Channel]):
    """The channels one may book (``bookable_by``); one kept for other groups is refused in the
    same words as the booking rule (docs/portal.md, "Groups"), not as "not one of the choices"."""

    def to_python(self, value: Any) -> Channel | None:
        try:
            return super().to_python(value)
        except forms.ValidationError:
            kept = Channel.objects.filter(pk=value).first() if str(value).isdigit() else None
            if kept is None:
                raise
            names = ", ".join(sorted(g.name for g in kept.allowed_groups.all()))
            raise forms.ValidationError(
                f"channel {kept.name} is for the groups {names}; you are in none of them",
                code="invalid_choice",
            ) from None


# The booker's choice (docs/gateway.md, "Lending"): offered where the channel lends.
LEND_LABEL = (
    "Lend my model to colleagues while I am idle (where the channel lends; my requests always come first)"
)


class BookingForm(forms.Form):
    channel = BookableChannelField(
        queryset=Channel.objects.all(), required=False, empty_label="Any channel that fits"
    )
    start = LocalDateTimeField()
    end = LocalDateTimeField()
    exclusive = forms.BooleanField(required=False, label="Whole card (no model, raw GPUs)")
    model = forms.ModelChoiceField(queryset=LLMModel.objects.all(), required=False)
    preset = forms.ModelChoiceField(queryset=Preset.objects.select_related("model"), required=False)
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}), max_length=2000)
    lend = forms.BooleanField(required=False, label=LEND_LABEL)
    repeat = forms.ChoiceField(
        choices=[
            ("", "Does not repeat"),
            ("daily", "Daily"),
            ("weekdays", "Every weekday"),
            ("weekly", "Weekly"),
            ("monthly", "Monthly, on the same date"),
            ("monthly_weekday", "Monthly, on the same weekday (the 2nd Tuesday)"),
        ],
        required=False,
    )
    every = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_EVERY,
        initial=1,
        label="Every",
        help_text="days, weeks or months",
    )
    on_days = forms.TypedMultipleChoiceField(
        choices=[(i, name.capitalize()) for i, name in enumerate(DAY_NAMES)],
        coerce=int,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Also on (weekly)",
    )
    until = forms.DateField(
        required=False, widget=forms.DateInput(attrs={"type": "date"}), label="Until (the last day)"
    )
    count = forms.IntegerField(
        required=False, min_value=1, max_value=MAX_OCCURRENCES, label="or this many times"
    )
    skip_conflicts = forms.BooleanField(
        required=False, label="Book the others, skipping the dates that cannot be booked"
    )

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if user is not None:
            field = self.fields["channel"]
            assert isinstance(field, BookableChannelField)
            field.queryset = bookable_by(user)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("repeat") and not data.get("until") and not data.get("count"):
            self.add_error("until", "Say until when it repeats, or how many times.")
        if data.get("repeat") and not data.get("channel"):
            self.add_error("channel", "A repeating booking is on one channel: choose it.")
        return data


class ChangeForm(forms.Form):
    start = LocalDateTimeField()
    end = LocalDateTimeField()
    model = forms.ModelChoiceField(queryset=LLMModel.objects.all(), required=False)
    preset = forms.ModelChoiceField(queryset=Preset.objects.select_related("model"), required=False)
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}), max_length=2000)
    lend = forms.BooleanField(required=False, label=LEND_LABEL)


class ExtendForm(forms.Form):
    end = LocalDateTimeField(label="New end")


class OverrideForm(forms.Form):
    model = forms.ModelChoiceField(queryset=LLMModel.objects.all(), required=False)
    preset = forms.ModelChoiceField(queryset=Preset.objects.select_related("model"), required=False)
    unload = forms.BooleanField(required=False)
    until = LocalDateTimeField()

    @classmethod
    def shared_selects(cls) -> OverrideSelects:
        """The model and preset lists, read (two queries) and drawn once for any number of
        channels' forms: the overview draws a form per channel, and drawing each list's options
        again per channel was most of the page's time."""
        form = cls(prefix=SHARED_PREFIX)
        return OverrideSelects(str(form["model"]), str(form["preset"]))


SHARED_PREFIX = "__prefix__"


@dataclass(frozen=True)
class OverrideSelects:
    model: str
    preset: str

    def for_prefix(self, prefix: str) -> tuple[SafeString, SafeString]:
        """The two lists as one channel's form names them (its prefix in their name and id)."""
        return (
            mark_safe(self.model.replace(SHARED_PREFIX, prefix)),
            mark_safe(self.preset.replace(SHARED_PREFIX, prefix)),
        )


def _zone_choices() -> list[tuple[str, str]]:
    return [(name, name) for name in sorted(zoneinfo.available_timezones())]


class PreferencesForm(forms.Form):
    time_zone = forms.ChoiceField(choices=_zone_choices)
    email = forms.EmailField(required=False, label="Email", help_text="Where SlotServe's emails to you go.")
    week_start = forms.TypedChoiceField(
        coerce=int,
        empty_value=None,
        required=False,  # left out (an older page, a script): as it was
        label="Weeks begin on",
        choices=list(enumerate(WEEKDAYS)),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for event in NotificationEvent:
            self.fields[f"email_{event.value}"] = forms.BooleanField(
                required=False, label=f"Email me: {event.label}"
            )


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=100)
    wait_seconds = forms.IntegerField(
        min_value=0,
        required=False,
        initial=0,
        label="Wait for a loading model (s)",
        help_text="Hold requests up to this long while their model loads, instead of answering 503.",
    )

    models = forms.ModelMultipleChoiceField(
        queryset=LLMModel.objects.all(),
        required=False,
        label="Only these models",
        help_text="None chosen: every model (and its aliases).",
    )
    channels = forms.ModelMultipleChoiceField(
        queryset=Channel.objects.all(), required=False, label="Only these channels", help_text="None: all."
    )
    expires = forms.DateField(
        required=False,
        widget=forms.DateInput(attrs={"type": "date"}),
        label="Stops working after",
        help_text="The last day it works (your zone); empty: it does not expire. You are told a week ahead.",
    )
    max_concurrent = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=10_000,
        label="At most this many requests at once",
        help_text="Empty: none of its own (yours apply to every key).",
    )
    requests_per_minute = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=1_000_000,
        label="At most this many requests a minute",
        help_text="Empty: none of its own.",
    )
    weekly_tokens = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=10**15,
        label="At most this many tokens a week",
        help_text="Outside your own slots, as your own budget. Empty: none of its own.",
    )
    read_only = forms.BooleanField(
        required=False,
        label="Read-only for the REST API (a dashboard's key)",
        help_text=(
            "Read-only in the REST API only: it still calls models through the gateway, as any key of yours."
        ),
    )

    def clean_wait_seconds(self) -> int:
        value = self.cleaned_data.get("wait_seconds") or 0
        limit = settings.SLOTSERVE_GATEWAY_MAX_WAIT_SECONDS
        if value > limit:
            raise forms.ValidationError(f"At most {limit} seconds.")
        return int(value)


class WebhookForm(forms.Form):
    """A new webhook (``reservations.webhooks.services.webhook_create`` checks the rest)."""

    name = forms.CharField(max_length=100, required=False, help_text="For you: which receiver it is.")
    url = forms.CharField(
        max_length=2000,
        label="URL",
        widget=forms.URLInput(attrs={"placeholder": "https://chat.example.org/hooks/…"}),
        help_text="Where each event is POSTed.",
    )
    events = forms.MultipleChoiceField(
        choices=WebhookEvent.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None chosen: every event.",
    )
    body = forms.ChoiceField(
        choices=Body.choices,
        initial=Body.STANDARD,
        label="Body",
        help_text="Slack-compatible: a line of text for a chat room's incoming-webhook URL.",
    )
    everyone = forms.BooleanField(required=False, label="Everyone's events, not only mine (staff)")
    channels = forms.ModelMultipleChoiceField(
        queryset=Channel.objects.all(),
        required=False,
        label="Only these channels' events (with everyone's)",
        help_text="None: every channel, and the nodes.",
    )


class BlackoutForm(forms.Form):
    """Close channels for a time (``reservations.services.blackouts.blackout_create`` checks it)."""

    channels = forms.ModelMultipleChoiceField(
        queryset=Channel.objects.order_by("name"),
        required=False,
        help_text="None chosen: every channel.",
        widget=forms.SelectMultiple(attrs={"size": 6}),
    )
    start = LocalDateTimeField()
    end = LocalDateTimeField()
    reason = forms.CharField(
        max_length=BLACKOUT_REASON_MOST, help_text="Quoted by every refusal and shown on the calendar."
    )
    cancel_bookings = forms.BooleanField(
        required=False,
        label="Cancel the bookings it overlaps",
        help_text="Their bookers are told the reason; unticked, overlapping bookings refuse the blackout.",
    )


class BulletinForm(forms.Form):
    text = forms.CharField(max_length=BULLETIN_MOST, widget=forms.Textarea(attrs={"rows": 3}))
    shown_from = LocalDateTimeField(required=False, label="Shown from", help_text="Empty: now.")
    shown_until = LocalDateTimeField(
        required=False, label="Shown until", help_text="Empty: until taken down."
    )


class InviteForm(forms.Form):
    emails = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}), max_length=20_000, help_text="One address a line."
    )
    groups = forms.ModelMultipleChoiceField(
        queryset=Group.objects.order_by("name"), required=False, help_text="The groups they join."
    )

    def clean_emails(self) -> list[str]:
        found = [line.strip() for line in self.cleaned_data["emails"].splitlines() if line.strip()]
        if not found:
            raise forms.ValidationError("Write at least one address.")
        if len(found) > 100:
            raise forms.ValidationError("At most 100 addresses at once.")
        return found


class AccountForm(forms.Form):
    """A new account's name and password (``reservations.joining`` checks the rest)."""

    username = forms.CharField(max_length=150, help_text="Letters, digits and @ . + - _ only.")
    password = forms.CharField(widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}))
    password_again = forms.CharField(
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}), label="The password again"
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("password") and data.get("password") != data.get("password_again"):
            self.add_error("password_again", "The two passwords differ.")
        return data


class SignupForm(AccountForm):
    email = forms.EmailField(help_text="A link to confirm it is yours goes there.")


class GroupForm(forms.Form):
    name = forms.CharField(max_length=150)
