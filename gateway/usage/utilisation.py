"""Usage and utilisation, as pure functions of what was booked, requested and loaded.

Time is counted in whole minutes (a minute counts when anything touched it). A channel's
minutes are shared out in this order, so the shares add up to the whole period:
``switching`` (a model loading), ``served_booker`` (a booking's own requests running),
``lent`` (booked, and only others' requests ran in the booker's idle time: docs/gateway.md,
"Lending"), ``booked_idle`` (booked, nothing asked), ``served_default`` (requests outside
bookings: the default model serving everyone), ``idle``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

SHARES = (
    "switching",
    "served_booker",
    "lent",
    "booked_idle",
    "served_default",
    "idle",
    "booked_to_come",
)


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
    borrowed: bool = False  # a request served in someone else's lent slot


# A set of minutes is an int of bits: bit i is the i-th minute from the period's first (the
# minute ``lo`` is in). Union is ``|``, what is left ``& ~``, the count ``bit_count()``: a week
# of a channel's minutes is one 10,080-bit number, not a set of ten thousand.
Minutes = int


def minutes(start: datetime, end: datetime, lo: datetime, hi: datetime) -> Minutes:
    """The minutes that ``[start, end)`` touches within ``[lo, hi)``."""
    first, last = max(start, lo).timestamp(), min(end, hi).timestamp()
    if last <= first:
        return 0
    base = int(lo.timestamp() // 60)
    a, b = int(first // 60) - base, int(-(-last // 60)) - base
    return ((1 << (b - a)) - 1) << a


def union(spans: Iterable[Span], lo: datetime, hi: datetime) -> Minutes:
    found = 0
    for span in spans:
        found |= minutes(span.start, span.end, lo, hi)
    return found


def channel_shares(
    *,
    bookings: list[Span],
    requests: list[Span],
    loads: list[Span],
    lo: datetime,
    hi: datetime,
    now: datetime,
) -> dict[str, float]:
    """How one channel's ``[lo, hi)`` went until ``now``, in hours per share, and its booked hours
    still to come (together they add up to the period's past and its booked future)."""
    return shares_of(
        switching=union(loads, lo, hi),
        booked=union(bookings, lo, hi),
        booker=union((r for r in requests if r.reservation_id is not None), lo, hi),
        default=union((r for r in requests if r.reservation_id is None), lo, hi),
        lent=union((r for r in requests if r.borrowed), lo, hi),
        lo=lo,
        hi=hi,
        now=now,
    )


def shares_of(
    *,
    switching: Minutes,
    booked: Minutes,
    booker: Minutes,
    default: Minutes,
    lo: datetime,
    hi: datetime,
    now: datetime,
    since: datetime | None = None,
    lent: Minutes = 0,
) -> dict[str, float]:
    """``channel_shares`` from the minutes of loads, bookings, bookers' requests and requests
    outside bookings (the report reads the last two from the roll-ups as minutes), and of
    borrowed requests (``lent``: among those outside bookings, the few the log marks). Time after
    ``now`` is not idle yet: only its booked minutes count, as still to come; nor is time before
    ``since``, when the channel was added."""
    total = minutes(max(lo, since or lo), min(max(now, lo), hi), lo, hi)
    to_come = booked & minutes(max(now, lo), hi, lo, hi) & ~total
    switching &= total
    served_booker = booker & total & ~switching
    lent &= booked & total & ~switching & ~served_booker
    booked_idle = booked & total & ~switching & ~served_booker & ~lent
    served_default = default & total & ~switching & ~booked
    idle = total & ~switching & ~served_booker & ~lent & ~booked_idle & ~served_default
    counts = {
        "switching": switching.bit_count(),
        "served_booker": served_booker.bit_count(),
        "lent": lent.bit_count(),
        "booked_idle": booked_idle.bit_count(),
        "served_default": served_default.bit_count(),
        "idle": idle.bit_count(),
        "booked_to_come": to_come.bit_count(),
    }
    return {name: round(counts[name] / 60, 2) for name in SHARES}


@dataclass(frozen=True)
class Totals:
    booked_hours: float  # until now: time still to come is neither used nor idle yet
    used_hours: float  # booked minutes in which the booking's own requests ran
    idle_booked_hours: float  # neither the booker's requests nor borrowers' ran
    lent_hours: float  # the booker idle, borrowers' requests ran (docs/gateway.md, "Lending")
    to_come_hours: float  # booked after now, within the period
    requests: int
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float | None  # the mean time to first token

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "booked_hours": self.booked_hours,
            "used_hours": self.used_hours,
            "idle_booked_hours": self.idle_booked_hours,
            "lent_hours": self.lent_hours,
            "to_come_hours": self.to_come_hours,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_ms": self.ttft_ms,
        }


@dataclass(frozen=True)
class Demand:
    """What requests asked, summed: how many, their tokens, and their times to first token."""

    requests: int = 0
    prompt: int = 0
    completion: int = 0
    ttft_sum: float = 0.0
    ttft_count: int = 0

    def __add__(self, other: Demand) -> Demand:
        return Demand(
            self.requests + other.requests,
            self.prompt + other.prompt,
            self.completion + other.completion,
            self.ttft_sum + other.ttft_sum,
            self.ttft_count + other.ttft_count,
        )

    @classmethod
    def of(cls, requests: Iterable[Span]) -> Demand:
        total = cls()
        for r in requests:
            has_ttft = r.ttft_ms is not None
            total += cls(1, r.prompt, r.completion, r.ttft_ms or 0.0, 1 if has_ttft else 0)
        return total


def totals(
    *,
    bookings: list[Span],
    requests: list[Span],
    lo: datetime,
    hi: datetime,
    now: datetime,
    borrowed: Iterable[Span] | None = None,
) -> Totals:
    """What ``bookings`` held and ``requests`` asked within ``[lo, hi)`` until ``now``: booked
    hours (exact), used hours (the booked minutes its own requests touched), lent hours (the
    booker idle, ``borrowed`` requests ran: whoever sent them; the borrowed among ``requests``
    unless given), idle booked hours, booked hours still to come, and the requests' counts,
    tokens and mean TTFT."""
    asked = Demand.of(r for r in requests if lo <= r.start < hi)
    ran: dict[int, Minutes] = {}
    for r in requests:
        if r.reservation_id is not None:
            ran[r.reservation_id] = ran.get(r.reservation_id, 0) | minutes(r.start, r.end, lo, hi)
    lent: dict[int | None, Minutes] = {}
    for r in borrowed if borrowed is not None else (r for r in requests if r.borrowed):
        lent[r.channel_id] = lent.get(r.channel_id, 0) | minutes(r.start, r.end, lo, hi)
    return totals_of(bookings=bookings, ran=ran, asked=asked, lo=lo, hi=hi, now=now, lent=lent)


def totals_of(
    *,
    bookings: list[Span],
    ran: Mapping[int, Minutes],
    asked: Demand,
    lo: datetime,
    hi: datetime,
    now: datetime,
    lent: Mapping[int | None, Minutes] | None = None,
) -> Totals:
    """``totals`` from the minutes each booking's own requests touched (``ran``, by booking; the
    report reads them from the roll-ups) and what the requests ``asked``, summed apart;
    ``lent``: by channel, the minutes borrowed requests touched (the booker's idle minutes among
    them are lent, not idle)."""
    booked_seconds = to_come_seconds = 0.0
    used = lent_out = 0
    lent = lent or {}
    # In seconds since the epoch: a report counts thousands of bookings (``minutes``, inlined).
    lo_s, hi_s = lo.timestamp(), hi.timestamp()
    passed_s = min(max(now.timestamp(), lo_s), hi_s)  # the period's end, or now within it
    base = int(lo_s // 60)
    for booking in bookings:
        start_s, end_s = booking.start.timestamp(), booking.end.timestamp()
        first, last = max(start_s, lo_s), min(end_s, passed_s)
        if last > first:
            booked_seconds += last - first
            a, b = int(first // 60) - base, int(-(-last // 60)) - base
            held = ((1 << (b - a)) - 1) << a
            own = ran.get(booking.reservation_id or 0, 0) & held
            used += own.bit_count()
            lent_out += (lent.get(booking.channel_id, 0) & held & ~own).bit_count()
        to_come_seconds += max(min(end_s, hi_s) - max(start_s, passed_s), 0.0)
    booked_hours = round(booked_seconds / 3600, 2)
    used_hours = min(round(used / 60, 2), booked_hours)
    lent_hours = min(round(lent_out / 60, 2), round(booked_hours - used_hours, 2))
    return Totals(
        booked_hours=booked_hours,
        used_hours=used_hours,
        idle_booked_hours=round(booked_hours - used_hours - lent_hours, 2),
        lent_hours=lent_hours,
        to_come_hours=round(to_come_seconds / 3600, 2),
        requests=asked.requests,
        prompt_tokens=asked.prompt,
        completion_tokens=asked.completion,
        ttft_ms=round(asked.ttft_sum / asked.ttft_count, 1) if asked.ttft_count else None,
    )
