"""Usage and utilisation, as pure functions of what was booked, requested and loaded.

Time is counted in whole minutes (a minute counts when anything touched it). A channel's
minutes are shared out in this order, so the shares add up to the whole period:
``switching`` (a model loading), ``served_booker`` (a booking's own requests running),
``booked_idle`` (booked, nothing asked), ``served_default`` (requests outside bookings: the
default model serving everyone), ``idle``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

SHARES = ("switching", "served_booker", "booked_idle", "served_default", "idle")


@dataclass(frozen=True)
class Span:
    """Something that took time on a channel: a booking, a request or a load."""

    start: datetime
    end: datetime
    channel_id: int | None
    user_id: int | None = None
    reservation_id: int | None = None  # a request's booking; a booking's own id
    prompt: int = 0
    completion: int = 0
    ttft_ms: float | None = None


def minutes(start: datetime, end: datetime, lo: datetime, hi: datetime) -> set[int]:
    """The minutes (since the epoch) that ``[start, end)`` touches within ``[lo, hi)``."""
    first, last = max(start, lo).timestamp(), min(end, hi).timestamp()
    if last <= first:
        return set()
    return set(range(int(first // 60), int(-(-last // 60))))


def _union(spans: Iterable[Span], lo: datetime, hi: datetime) -> set[int]:
    found: set[int] = set()
    for span in spans:
        found |= minutes(span.start, span.end, lo, hi)
    return found


def channel_shares(
    *, bookings: list[Span], requests: list[Span], loads: list[Span], lo: datetime, hi: datetime
) -> dict[str, float]:
    """How one channel's ``[lo, hi)`` went, in hours per share (they add up to the period)."""
    total = minutes(lo, hi, lo, hi)
    switching = _union(loads, lo, hi)
    booked = _union(bookings, lo, hi)
    served_booker = _union((r for r in requests if r.reservation_id is not None), lo, hi) - switching
    booked_idle = booked - switching - served_booker
    served_default = _union((r for r in requests if r.reservation_id is None), lo, hi) - switching - booked
    idle = total - switching - served_booker - booked_idle - served_default
    counts = {
        "switching": len(switching & total),
        "served_booker": len(served_booker & total),
        "booked_idle": len(booked_idle & total),
        "served_default": len(served_default & total),
        "idle": len(idle),
    }
    return {name: round(counts[name] / 60, 2) for name in SHARES}


@dataclass(frozen=True)
class Totals:
    booked_hours: float
    used_hours: float  # booked minutes in which the booking's own requests ran
    idle_booked_hours: float
    requests: int
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float | None  # the mean time to first token

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "booked_hours": self.booked_hours,
            "used_hours": self.used_hours,
            "idle_booked_hours": self.idle_booked_hours,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_ms": self.ttft_ms,
        }


@dataclass(frozen=True)
class Asked:
    """What requests asked, summed: how many, their tokens, and their times to first token."""

    requests: int = 0
    prompt: int = 0
    completion: int = 0
    ttft_sum: float = 0.0
    ttft_count: int = 0

    def __add__(self, other: Asked) -> Asked:
        return Asked(
            self.requests + other.requests,
            self.prompt + other.prompt,
            self.completion + other.completion,
            self.ttft_sum + other.ttft_sum,
            self.ttft_count + other.ttft_count,
        )

    @classmethod
    def of(cls, requests: Iterable[Span]) -> Asked:
        total = cls()
        for r in requests:
            has_ttft = r.ttft_ms is not None
            total += cls(1, r.prompt, r.completion, r.ttft_ms or 0.0, 1 if has_ttft else 0)
        return total


def totals(*, bookings: list[Span], requests: list[Span], lo: datetime, hi: datetime) -> Totals:
    """What ``bookings`` held and ``requests`` asked within ``[lo, hi)``: booked hours (exact),
    used hours (the booked minutes its own requests touched), idle booked hours, and the
    requests' counts, tokens and mean TTFT."""
    asked = Asked.of(r for r in requests if lo <= r.start < hi)
    return totals_of(bookings=bookings, runs=requests, asked=asked, lo=lo, hi=hi)


def totals_of(*, bookings: list[Span], runs: list[Span], asked: Asked, lo: datetime, hi: datetime) -> Totals:
    """``totals`` from the requests' spans (``runs``: requests, or runs of them merged where
    their minutes touch, which touch the same minutes) and what they ``asked``, summed apart
    (the report sums it in the database)."""
    booked_seconds = 0.0
    used = 0
    by_booking: dict[int | None, list[Span]] = {}
    for run in runs:
        by_booking.setdefault(run.reservation_id, []).append(run)
    for booking in bookings:
        first, last = max(booking.start, lo), min(booking.end, hi)
        booked_seconds += max((last - first).total_seconds(), 0.0)
        held = minutes(booking.start, booking.end, lo, hi)
        used += len(_union(by_booking.get(booking.reservation_id, []), lo, hi) & held)
    booked_hours = round(booked_seconds / 3600, 2)
    used_hours = min(round(used / 60, 2), booked_hours)
    return Totals(
        booked_hours=booked_hours,
        used_hours=used_hours,
        idle_booked_hours=round(booked_hours - used_hours, 2),
        requests=asked.requests,
        prompt_tokens=asked.prompt,
        completion_tokens=asked.completion,
        ttft_ms=round(asked.ttft_sum / asked.ttft_count, 1) if asked.ttft_count else None,
    )
