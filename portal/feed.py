"""A person's bookings as iCalendar (the calendar feed, docs/portal.md).

Calendar programs fetch the feed every few minutes; an unchanged feed is answered ``304`` by its
ETag (``portal.account.calendar_feed``). When something changed, the feed is written again. The
calendar's head (its properties and the zone's ``VTIMEZONE``) is written by icalendar once per
zone; each booking's ``VEVENT`` is put together here, escaped and its moments written as
icalendar writes them and folded by icalendar, its properties in icalendar's order: icalendar's
``Event`` takes 0.13 to 0.27 ms a booking, this a twentieth of that (docs/benchmarks.md). The feed
is byte for byte the text icalendar writes for the whole calendar (tests/test_portal_calendar.py),
and each ``VEVENT`` is kept, per web process, under what it shows.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo

from icalendar import Calendar, Event, Parameters
from icalendar.parser import Contentline

END = b"END:VCALENDAR\r\n"


@dataclass(frozen=True)
class FeedEvent:
    """What the feed shows of one booking."""

    pk: int
    status: str
    start: datetime
    end: datetime
    channel: str
    what: str  # its model's name, or "whole card"
    note: str
    created: datetime


def feed_ical(events: list[FeedEvent], zone: tzinfo, host: str) -> bytes:
    """The feed of ``events``, times in ``zone`` (with its ``VTIMEZONE``), their UIDs at ``host``."""
    return _head(zone, bool(events)) + b"".join(_vevent(e, zone, host) for e in events) + END


def _calendar(zone: tzinfo) -> Calendar:
    calendar = Calendar()
    calendar.add("prodid", "-//SlotServe//reservations//EN")
    calendar.add("version", "2.0")
    calendar.add("x-wr-calname", "SlotServe reservations")
    calendar.add("x-wr-timezone", str(zone))
    return calendar


def event_of(e: FeedEvent, zone: tzinfo, host: str) -> Event:
    event = Event()
    event.add("uid", f"reservation-{e.pk}@{host}")
    event.add("summary", f"{e.channel}: {e.what}" + (" (pending)" if e.status == "pending" else ""))
    # In the person's zone (with its VTIMEZONE), as the portal shows them.
    event.add("dtstart", e.start.astimezone(zone))
    event.add("dtend", e.end.astimezone(zone))
    event.add("dtstamp", e.created)
    if e.note:
        event.add("description", e.note)
    return event


def whole_calendar(events: list[FeedEvent], zone: tzinfo, host: str) -> Calendar:
    """The feed as one icalendar ``Calendar`` (what ``feed_ical`` writes piece by piece)."""
    calendar = _calendar(zone)
    for e in events:
        calendar.add_component(event_of(e, zone, host))
    calendar.add_missing_timezones()
    return calendar


@functools.lru_cache(maxsize=20_000)
def _vevent(e: FeedEvent, zone: tzinfo, host: str) -> bytes:
    """``event_of(e, zone, host).to_ical()``, written without building the ``Event``."""
    moment, utc = _moment_format(zone)
    start, end = e.start.astimezone(zone), e.end.astimezone(zone)
    summary = f"{e.channel}: {e.what}" + (" (pending)" if e.status == "pending" else "")
    zulu = "Z" if utc else ""
    lines = [
        "BEGIN:VEVENT",
        _text("SUMMARY", summary),
        f"DTSTART{moment}{_stamp(start)}{zulu}",
        f"DTEND{moment}{_stamp(end)}{zulu}",
        f"DTSTAMP:{_stamp(e.created.astimezone(UTC))}Z",
        _text("UID", f"reservation-{e.pk}@{host}"),
    ]
    if e.note:
        lines.append(_text("DESCRIPTION", e.note))
    lines.append("END:VEVENT\r\n")
    return "\r\n".join(lines).encode()


def _stamp(moment: datetime) -> str:
    """A moment as iCalendar's DATE-TIME writes it (``20260329T013000``; whole seconds)."""
    m = moment
    return f"{m.year:04d}{m.month:02d}{m.day:02d}T{m.hour:02d}{m.minute:02d}{m.second:02d}"


def _text(name: str, value: str) -> str:
    """A text property's line, escaped as icalendar escapes TEXT (RFC 5545, 3.3.11: backslash,
    semicolon, comma, line breaks), and folded by icalendar where it is longer than a line may be
    (74 octets and under, folding leaves a line as it is)."""
    escaped = (
        value.replace(r"\N", "\n")
        .replace("\\", "\\\\")
        .replace(";", r"\;")
        .replace(",", r"\,")
        .replace("\r\n", r"\n")
        .replace("\n", r"\n")
        .replace("\r", r"\n")
    )
    line = f"{name}:{escaped}"
    if len(line) * 4 <= _FOLD_AT or len(line.encode()) <= _FOLD_AT:
        return line
    folded: bytes = Contentline.from_parts(name, _NO_PARAMETERS, value).to_ical()
    return folded.decode()


_FOLD_AT = 74


_NO_PARAMETERS = Parameters()


@functools.lru_cache(maxsize=256)
def _moment_format(zone: tzinfo) -> tuple[str, bool]:
    """How icalendar writes a moment in ``zone``: what comes between the property's name and its
    value (``;TZID=Europe/Berlin:``, or ``:`` for UTC), and whether the value is in UTC."""
    line = next(
        line
        for line in bytes(event_of(FeedEvent(0, "", _ANY, _ANY, "", "", "", _ANY), zone, "").to_ical())
        .decode()
        .split("\r\n")
        if line.startswith("DTSTART")
    )
    params, value = line.removeprefix("DTSTART").rsplit(":", 1)
    return params + ":", value.endswith("Z")


@functools.lru_cache(maxsize=256)
def _head(zone: tzinfo, any_event: bool) -> bytes:
    """The calendar's properties and, when it holds events, its zone's ``VTIMEZONE`` (none for
    UTC), as icalendar writes them before the events."""
    calendar = _calendar(zone)
    if any_event:
        calendar.add_component(event_of(FeedEvent(0, "", _ANY, _ANY, "", "", "", _ANY), zone, ""))
        calendar.add_missing_timezones()
        calendar.subcomponents = [c for c in calendar.subcomponents if c.name == "VTIMEZONE"]
    return bytes(calendar.to_ical()).removesuffix(END)


_ANY = datetime(2000, 1, 1, tzinfo=UTC)
