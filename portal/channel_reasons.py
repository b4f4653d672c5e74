"""Why a channel runs what it runs, in words (the overview's "why" column)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, tzinfo


@dataclass(frozen=True)
class BookingFacts:
    """The reservation a decision serves, as the words need it."""

    user: str
    start: datetime
    end: datetime


def _hm(moment: datetime, tz: tzinfo) -> str:
    return moment.astimezone(tz).strftime("%H:%M")


def why(*, reason: str | None, booking: BookingFacts | None, valid_until: datetime | None, tz: tzinfo) -> str:
    """The decision's reason as a sentence, times in the reader's time zone."""
    if reason is None:
        return "not decided yet"
    if booking is not None:
        owner = booking.user
        texts = {
            "active_reservation": f"booked by {owner} until {_hm(booking.end, tz)}",
            "active_exclusive": f"whole card booked by {owner} until {_hm(booking.end, tz)}",
            "preload_next": f"preloading for {owner}'s {_hm(booking.start, tz)} booking",
            "stop_for_exclusive": f"stopping for {owner}'s whole-card booking at {_hm(booking.start, tz)}",
            "skip_default_short_gap": f"loading {owner}'s {_hm(booking.start, tz)} model directly "
            "(too little time to load the default first)",
            "fallback_default": f"default model serving {owner}'s booking "
            "while the booked model waits to retry",
        }
        if reason in texts:
            return texts[reason]
    until = f" until {_hm(valid_until, tz)}" if valid_until else ""
    return {
        "manual_override": f"set by an admin{until}",
        "manual_unload": f"unloaded by an admin{until}",
        "on_demand": f"loaded on demand, until idle{' or ' + _hm(valid_until, tz) if valid_until else ''}",
        "default": "default model",
        "idle": "no default model: idle",
    }.get(reason, reason.replace("_", " "))


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "under a second"
    if seconds < 120:
        return f"{int(seconds)} s"
    return f"{int(seconds // 60)} min"


def loading_words(*, elapsed: float, estimate: float | None) -> str:
    """A loading card's line: "loading: 12 s so far, usually about 40 s" (no "0 s of about 0 s"
    for a model that loads in a blink; "longer than the usual …" when it is late)."""
    said = f"loading: {_duration(elapsed)} so far"
    if estimate is None:
        return said
    if estimate >= 1 and elapsed > 1.5 * estimate:
        return f"{said}, longer than the usual {_duration(estimate)}"
    return f"{said}, usually {'' if estimate < 1 else 'about '}{_duration(estimate)}"
