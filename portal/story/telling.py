"""A channel's story told in words (docs/scheduling.md, "A channel's story"): pure functions of
the facts the reads gather (``portal.story.reads``), with ``now`` and the reader's time
zone passed in.

``lines`` puts every happening on one time axis, oldest first; ``verdict`` says in a sentence or
three why a booking's model was, or was not, ready when its slot began.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from typing import Any

from channels_app.scheduling.load_estimates import BASIS_WORDS
from portal.channel_reasons import BookingFacts, why
from slotserve_base.iso import parse_moment


@dataclass(frozen=True)
class Entry:
    """One kept row of the story (``channels_app.models.StoryEntry``)."""

    at: datetime
    kind: str
    data: Mapping[str, Any]


@dataclass(frozen=True)
class Booking:
    id: int
    user: str
    start: datetime
    end: datetime
    model_id: int | None
    preset_id: int | None
    exclusive: bool
    ended_early: bool = False
    released_idle_at: datetime | None = None
    status: str = "approved"  # pending, approved, rejected, cancelled, ended


@dataclass(frozen=True)
class Names:
    """Names of what the rows name by id (a model or preset removed since: "a removed model")."""

    models: Mapping[int, str] = field(default_factory=dict)
    presets: Mapping[int, str] = field(default_factory=dict)
    bookings: Mapping[int, Booking] = field(default_factory=dict)

    def target(self, model_id: int | None, preset_id: int | None) -> str:
        if model_id is None:
            return "nothing"
        model = self.models.get(model_id, "a removed model")
        return f"{model} ({self.presets.get(preset_id, 'a removed preset')})" if preset_id else model


@dataclass(frozen=True)
class Line:
    at: datetime
    kind: str
    words: str
    booking_id: int | None = None


def _hms(moment: datetime, tz: tzinfo) -> str:
    return moment.astimezone(tz).strftime("%H:%M:%S")


def seconds(value: float) -> str:
    """A span in words: "40 s", "3 min 5 s", "2 h 10 min"."""
    whole = round(value)
    if value < 1:
        return "under a second"
    if whole < 120:
        return f"{whole} s"
    if whole < 7200:
        return f"{whole // 60} min" + (f" {whole % 60} s" if whole % 60 else "")
    return f"{whole // 3600} h" + (f" {whole // 60 % 60} min" if whole // 60 % 60 else "")


def about(value: float) -> str:
    """An estimate in words: "about 40 s", or "under a second" (never "about under a second")."""
    said = seconds(value)
    return said if value < 1 else f"about {said}"


def _basis(d: Mapping[str, Any]) -> str:
    """What the planned load estimate was made from, where the story kept it."""
    if d.get("load_basis") not in BASIS_WORDS:
        return ""
    margin = d.get("load_margin") or 0
    learnt = f", with {seconds(margin)} of margin learnt from this node's late loads" if margin >= 1 else ""
    return f" (from {BASIS_WORDS[d['load_basis']]}{learnt})"


def _error(data: Mapping[str, Any]) -> str:
    """A failure's explanation, without its last full stop (the sentence around it ends it)."""
    return str(data.get("error") or "no reason given").rstrip().rstrip(".")


def _said(entry: Entry, names: Names, tz: tzinfo) -> str:
    d = entry.data
    what = names.target(d.get("model_id"), d.get("preset_id"))
    by = d.get("by") or "the system"
    booking = names.bookings.get(d.get("booking_id") or 0)
    kind = entry.kind
    if kind == "decided":
        facts = BookingFacts(booking.user, booking.start, booking.end) if booking else None
        until = parse_moment(d["until"]) if d.get("until") else None
        reason = why(reason=d.get("reason"), booking=facts, valid_until=until, tz=tz)
        load = d.get("load_seconds")
        preload = bool(load) and d.get("reason") == "preload_next"
        est = f"; it loads in {about(load)} here{_basis(d)}" if load and preload else ""
        return f"The scheduler chose {what}: {reason}{est}."
    if kind == "override_set":
        set_to = "unload" if d.get("unload") else what
        return f"{by} set an override: {set_to} until {_hms(parse_moment(d['until']), tz)}."
    if kind == "failed":
        tries = (
            f" (attempt {d['attempts']}, next try at {_hms(parse_moment(d['retry_at']), tz)})"
            if d.get("retry_at")
            else ""
        )
        return f"{what} failed: {_error(d)}{tries}."
    if kind == "prewarmed":
        return _prewarmed(d, what, booking, tz)
    if kind in ("on_demand", "on_demand_freed"):
        return _on_demand(kind, d, what, by)
    if kind in ("node_not_ready", "node_ready"):
        node = (d.get("node") or {}).get("name", "its node")
        if kind == "node_ready":
            return f"Node {node}'s worker reports again."
        heard = (
            f" (last heard at {_hms(parse_moment(d['last_heartbeat']), tz)})"
            if d.get("last_heartbeat")
            else ""
        )
        return f"Node {node}'s worker stopped reporting{heard}: its channels cannot change."
    fallback = " as the fallback" if d.get("fallback") else ""
    attempt = f", attempt {d['attempt']}" if d.get("attempt") else ""
    load_took = f" (loaded in {seconds(d['load_seconds'])})" if d.get("load_seconds") is not None else ""
    if d.get("woke_seconds") is not None:  # a sleeper woken, not loaded (docs/scheduling.md)
        load_took = f" (woken in {seconds(d['woke_seconds'])}, not loaded)"
    said = {
        "override_cleared": f"{by} cleared the override.",
        "reload": f"{by} asked for a reload.",
        "loading": f"Waking {what}{fallback}: it slept with its weights in host RAM."
        if d.get("wake")
        else f"Loading {what}{fallback}{attempt}.",
        "ready": f"{what} is ready{fallback}{load_took}.",
        "fallback": f"The default model {what} serves {booking.user + chr(39) + 's' if booking else 'the'} "
        "booking while the booked model waits for its retry.",
        "recovered": f"{what} serves again after its failure.",
        "switched": f"Switched from {names.target(d.get('previous_model_id'), None)} to {what}.",
        "draining": f"Draining {what}: requests in flight finish before it stops.",
        "stopping": f"Putting {what} to sleep, to be woken for its next turn."
        if d.get("sleep")
        else f"Stopping {what}.",
        "stopped": f"{what} stopped.",
    }
    return said.get(kind, kind.replace("_", " "))


def _on_demand(kind: str, d: Mapping[str, Any], what: str, by: str) -> str:
    """A load on demand made, or released (docs/scheduling.md, "Loaded on demand")."""
    if kind == "on_demand":
        load = d.get("load_seconds")
        takes = f"; it loads in {about(load)} here" if load else ""
        return f"Loaded {what} on demand for {by}, as no channel ran it{takes}."
    why = d.get("why")
    if why == "idle":
        return f"Released {what}, loaded on demand: no request for {seconds(d.get('idle_seconds') or 0)}."
    if why == "booking":
        return f"Released {what}, loaded on demand: a booking claimed the channel."
    if why == "failed":
        return f"Released {what}, loaded on demand: it failed to load."
    return f"{by} released {what}, loaded on demand."


def _prewarmed(d: Mapping[str, Any], what: str, booking: Booking | None, tz: tzinfo) -> str:
    """The node read a booking's model file into memory ahead of its load."""
    for_whom = f" for {booking.user}'s {booking.start.astimezone(tz):%H:%M} booking" if booking else ""
    size = d.get("bytes") or 0
    read = (
        f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{size / 1e6:.0f} MB"
    ) + f" in {seconds(d.get('seconds') or 0)}"
    if d.get("complete"):
        return f"Prewarmed {what}'s file{for_whom}: {read} read into memory ahead of its load."
    return f"Began prewarming {what}'s file{for_whom}; stopped after {read}: {d.get('why') or 'stopped'}."


def _booking_lines(booking: Booking, start: datetime, end: datetime) -> list[Line]:
    """A booking's start and end within ``start``–``end`` (``end``: no later than now)."""
    what = "the whole card" if booking.exclusive else "its model"
    found = []
    if start <= booking.start < end:
        found.append(
            Line(booking.start, "booking_started", f"{booking.user}'s slot began ({what}).", booking.id)
        )
    if booking.released_idle_at is not None and start <= booking.released_idle_at < end:
        found.append(
            Line(
                booking.released_idle_at,
                "booking_released",
                f"{booking.user}'s slot was released: unused.",
                booking.id,
            )
        )
    elif start <= booking.end < end:
        how = "was ended early" if booking.ended_early else "ended"
        found.append(Line(booking.end, "booking_ended", f"{booking.user}'s slot {how}.", booking.id))
    return found


def lines(
    entries: Iterable[Entry],
    bookings: Iterable[Booking],
    names: Names,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    tz: tzinfo,
) -> list[Line]:
    """Every happening from ``start`` to ``end`` on one axis, oldest first (at the same moment, a
    booking's start before what the channel did for it); a booking's start or end still to come
    is not told."""
    told = [
        Line(e.at, e.kind, _said(e, names, tz), e.data.get("booking_id"))
        for e in entries
        if start <= e.at < end
    ]
    for booking in bookings:
        told.extend(_booking_lines(booking, start, min(end, now)))
    order = {"booking_ended": 0, "booking_released": 0, "booking_started": 1}
    return sorted(told, key=lambda line: (line.at, order.get(line.kind, 2)))


def _first(
    entries: Sequence[Entry], kind: str, after: datetime, before: datetime, **match: Any
) -> Entry | None:
    for e in entries:
        if e.kind == kind and after <= e.at < before and all(e.data.get(k) == v for k, v in match.items()):
            return e
    return None


def _phase_at(entries: Sequence[Entry], moment: datetime) -> Entry | None:
    """The last step of the process at or before ``moment``."""
    steps = ("loading", "ready", "failed", "draining", "stopping", "stopped")
    last = None
    for e in entries:
        if e.at > moment:
            break
        if e.kind in steps:
            last = e
    return last


def verdict(
    booking: Booking,
    entries: Sequence[Entry],
    names: Names,
    *,
    previous: Booking | None,
    estimate: float | None,
    now: datetime,
    tz: tzinfo,
) -> str:
    """Why ``booking``'s model was, or was not, ready at its start, in words. ``entries``: the
    channel's story around the booking, oldest first; ``previous``: the booking that ended last
    before it on the channel; ``estimate``: the model's load estimate on the node now (the one
    the scheduler planned with is preferred where the story kept it)."""
    whose = f"{booking.user}'s"
    what = names.target(booking.model_id, booking.preset_id)
    if booking.status in ("cancelled", "rejected"):
        return f"{whose} booking was {booking.status}: nothing was loaded for it."
    if booking.status == "pending":
        return (
            f"{whose} booking is waiting for approval: a pending booking holds its slot but loads "
            f"nothing; once approved, {what} is preloaded before it begins."
        )
    if booking.exclusive:
        step = _phase_at(entries, booking.start)
        if step is None or step.kind == "stopped":
            return f"{whose} booking holds the whole card: no model ran when it began."
        return (
            f"{whose} booking holds the whole card; at its start the channel's process was still {step.kind}."
        )
    planned = _first(
        entries, "decided", booking.start - timedelta(days=1), booking.end, booking_id=booking.id
    )
    load = (planned.data.get("load_seconds") if planned else None) or estimate
    basis = _basis(planned.data) if planned and planned.data.get("load_seconds") else ""
    load_words = (
        f"this model loads in {about(load)} on this node{basis}" if load else "its load time is not known"
    )
    if now < booking.start:
        return f"{whose} slot has not begun: {what} will be preloaded in time ({load_words})."
    target = {"model_id": booking.model_id, "preset_id": booking.preset_id, "fallback": False}
    step = _phase_at(entries, booking.start)
    if step is not None and step.kind == "ready" and all(step.data.get(k) == v for k, v in target.items()):
        ahead = booking.start - step.at
        loaded = f" (loaded in {seconds(step.data['load_seconds'])})" if step.data.get("load_seconds") else ""
        return (
            f"{what} was ready when {whose} slot began: ready at {_hms(step.at, tz)}, "
            f"{seconds(ahead.total_seconds())} before the start{loaded}."
        )
    said = [f"{what} was not ready when {whose} slot began at {_hms(booking.start, tz)}."]
    since = planned.at if planned else booking.start
    if previous is not None and load and previous.end > booking.start - timedelta(seconds=load):
        gap = max(0.0, (booking.start - previous.end).total_seconds())
        said.append(
            f"The gap before the slot was {seconds(gap)} ({previous.user}'s booking ended at "
            f"{_hms(previous.end, tz)}); {load_words}."
        )
    elif planned is not None and planned.at >= booking.start:
        said.append(
            f"The scheduler chose it at {_hms(planned.at, tz)}, after the slot had begun; {load_words}."
        )
    elif planned is not None:
        lead = (booking.start - planned.at).total_seconds()
        said.append(f"Preloading was chosen at {_hms(planned.at, tz)}, {seconds(lead)} ahead; {load_words}.")
    failed = _first(entries, "failed", since, booking.end, model_id=booking.model_id)
    if failed is not None:
        said.append(f"It failed at {_hms(failed.at, tz)}: {_error(failed.data)}.")
        fallback = _first(entries, "ready", failed.at, booking.end, fallback=True)
        if fallback is not None:
            default = names.target(fallback.data.get("model_id"), fallback.data.get("preset_id"))
            said.append(f"The default model {default} served the booking from {_hms(fallback.at, tz)}.")
    said.extend(_held(entries, since, booking, names, tz))
    spell = _first(entries, "node_not_ready", since - timedelta(hours=1), booking.start)
    if spell is not None:
        back = _first(entries, "node_ready", spell.at, booking.end)
        until = f" until {_hms(back.at, tz)}" if back else ""
        if back is None or back.at > since:
            said.append(f"The node's worker was not reporting from {_hms(spell.at, tz)}{until}.")
    ready = _first(entries, "ready", booking.start, booking.end, **target)
    if ready is not None:
        late = (ready.at - booking.start).total_seconds()
        said.append(
            f"It was ready at {_hms(ready.at, tz)}, {seconds(late)} into the slot{_took(ready, load)}."
        )
    elif now < booking.end:
        said.append("It is not ready yet.")
    else:
        said.append("It was not ready during the slot.")
    return " ".join(said)


# A load's start this long after the plan is a wait someone should hear of.
HELD_SECONDS = 5.0


def _held(entries: Sequence[Entry], since: datetime, booking: Booking, names: Names, tz: tzinfo) -> list[str]:
    """When the booked model's load began, where that was well after the plan, and what held
    the channel meanwhile (the process before it, draining or stopping)."""
    began = _first(
        entries, "loading", since, booking.end, model_id=booking.model_id, preset_id=booking.preset_id
    )
    if began is None or (began.at - since).total_seconds() < HELD_SECONDS:
        return []
    words = f"Its load began at {_hms(began.at, tz)}, {seconds((began.at - since).total_seconds())} later"
    before = [
        e
        for e in entries
        if e.at <= began.at and e is not began and e.kind in ("ready", "draining", "stopping")
    ]
    held = before[-1] if before else None
    if held is None or held.data.get("model_id") is None:
        return [f"{words}."]
    stopped = _first(entries, "stopped", held.at, began.at + timedelta(seconds=1))
    until = stopped.at if stopped is not None else began.at
    what = names.target(held.data.get("model_id"), held.data.get("preset_id"))
    return [f"{words}: {what} held the channel until it stopped at {_hms(until, tz)}."]


def _took(ready: Entry, expected: float | None) -> str:
    """How long the load that made it ready took, and the estimate where it was far off."""
    took = ready.data.get("load_seconds")
    if not took:
        return ""
    if expected and abs(took - expected) > max(5.0, 0.25 * expected):
        return f"; this load took {seconds(took)}, not the {seconds(expected)} expected"
    return f"; this load took {seconds(took)}"
