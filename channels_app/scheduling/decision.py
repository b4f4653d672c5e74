"""The scheduling decision of docs/scheduling.md, as pure functions.

``decide`` answers "what should this channel run at ``now``, why, and until
when does that answer hold?" from plain data. ``plan`` strings decisions
together into a timeline. Nothing here touches the database, the clock or a
process: ``channels_app.scheduling.selectors`` gathers the inputs and
``channels_app.scheduling.services`` stores the outcome.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from slotserve_base.target import Target
from slotserve_base.vocabulary import Reason


@dataclass(frozen=True)
class Slot:
    """A reservation as the decision sees it.

    ``target`` is None for a whole-card reservation. ``counts`` is False for
    reservations that must not make the channel busy (pending, rejected,
    cancelled): docs/scheduling.md says pending ones never load anything.
    """

    id: int
    start: datetime
    end: datetime
    target: Target | None
    counts: bool = True

    @property
    def exclusive(self) -> bool:
        return self.target is None


@dataclass(frozen=True)
class OverrideFacts:
    """An admin's manual choice; ``target`` None means unload (README, Concepts)."""

    target: Target | None
    until: datetime
    set_at: datetime


@dataclass(frozen=True)
class OnDemandFacts:
    """A model someone's request loaded on the free channel (docs/scheduling.md rule 5), since
    ``since``; it holds until released or until a reservation claims the channel."""

    target: Target
    since: datetime


@dataclass(frozen=True)
class SchedulingSettings:
    """The settings of docs/settings.md that the decision uses, in seconds."""

    min_preload_seconds: float = 180.0
    switch_buffer_seconds: float = 60.0
    stop_timeout_seconds: float = 15.0


@dataclass(frozen=True)
class DecisionInput:
    """Everything the decision needs for one channel.

    ``slots`` must hold at least the reservation active at the moments asked
    about, the next one after them, and the latest one that started before
    them (it tells whether an override has been cut by a reservation).
    ``load_seconds`` holds the load estimate (docs/scheduling.md) of every target that
    can become the target: the default and the reservations' models.
    ``running`` is what the channel's process runs now (None: nothing).
    """

    default: Target | None
    slots: Sequence[Slot] = ()
    override: OverrideFacts | None = None
    running: Target | None = None
    on_demand: OnDemandFacts | None = None
    load_seconds: Mapping[Target, float] = field(default_factory=dict)
    settings: SchedulingSettings = SchedulingSettings()


@dataclass(frozen=True)
class Decision:
    """A channel's target, the rule that chose it, and how long it holds.

    ``valid_until`` is the first moment at which the same inputs may give
    another answer (None: not before the inputs change). ``reservation_id``
    names the reservation the decision serves or prepares for.
    """

    target: Target | None
    reason: Reason
    valid_until: datetime | None
    reservation_id: int | None = None


@dataclass(frozen=True)
class PlanSegment:
    start: datetime
    end: datetime
    target: Target | None
    reason: Reason
    reservation_id: int | None = None


# Moments at which a rule takes over are computed exactly; a rule that fires
# strictly after a moment (the short-gap rule's ``<``) is stepped past by this.
_INSTANT = timedelta(microseconds=1)
PRELOAD_EXTRA_SECONDS = 60.0
EXCLUSIVE_STOP_EXTRA_SECONDS = 60.0


def _load(inp: DecisionInput, target: Target | None) -> float:
    if target is None:
        return 0.0
    try:
        return inp.load_seconds[target]
    except KeyError:
        raise KeyError(f"no load estimate given for {target}") from None


def preload_lead_seconds(inp: DecisionInput, slot: Slot) -> float:
    """How long before ``slot`` starts its channel must change (docs/scheduling.md rule 2).

    A model reservation loads at the earlier of "load estimate + 60 s" and the
    minimum preload lead before it starts; for a whole-card one the process
    stops ``SLOTSERVE_STOP_TIMEOUT_SECONDS + 60`` s before.
    """
    if slot.exclusive:
        return inp.settings.stop_timeout_seconds + EXCLUSIVE_STOP_EXTRA_SECONDS
    return max(_load(inp, slot.target) + PRELOAD_EXTRA_SECONDS, inp.settings.min_preload_seconds)


def short_gap_seconds(inp: DecisionInput, slot: Slot) -> float | None:
    """The gap below which loading the default is not worth it (docs/scheduling.md rule 3).

    None when the rule cannot apply: the channel has no default to skip, or it
    runs its default already (then it simply keeps running it).
    """
    if inp.default is None or inp.running == inp.default:
        return None
    return _load(inp, inp.default) + _load(inp, slot.target) + 2 * inp.settings.switch_buffer_seconds


def _active_and_next(slots: Sequence[Slot], now: datetime) -> tuple[Slot | None, Slot | None]:
    active: Slot | None = None
    upcoming: Slot | None = None
    for slot in slots:
        if not slot.counts:
            continue
        if slot.start <= now < slot.end:
            active = slot
        elif slot.start > now and (upcoming is None or slot.start < upcoming.start):
            upcoming = slot
    return active, upcoming


def _takeover(inp: DecisionInput, upcoming: Slot | None) -> datetime | None:
    """The first moment rule 2 or rule 3 claims the channel for ``upcoming``."""
    if upcoming is None:
        return None
    lead = preload_lead_seconds(inp, upcoming)
    gap = short_gap_seconds(inp, upcoming)
    if gap is not None:
        lead = max(lead, gap)
    return upcoming.start - timedelta(seconds=lead)


def override_end(inp: DecisionInput, now: datetime) -> datetime | None:
    """When the override stops counting: ``until`` or the next reservation's start.

    A reservation that started since the override was set has already ended
    it, even after that reservation is over (README, Concepts: "valid until its until
    time or until the next reservation starts, whichever is first").
    """
    override = inp.override
    if override is None:
        return None
    end = override.until
    for slot in inp.slots:
        if slot.counts and slot.start >= override.set_at:
            end = min(end, slot.start)
    return end if now < end else None


def on_demand_holds(inp: DecisionInput, now: datetime) -> bool:
    """Whether the load on demand still counts: no reservation has started since it was made
    (after a booking the channel goes back to its default, not to the load)."""
    on_demand = inp.on_demand
    if on_demand is None:
        return False
    return not any(slot.counts and on_demand.since <= slot.start <= now for slot in inp.slots)


def _earliest(*moments: datetime | None) -> datetime | None:
    present = [m for m in moments if m is not None]
    return min(present) if present else None


def decide(inp: DecisionInput, now: datetime) -> Decision:
    """The target of one channel at ``now`` by docs/scheduling.md; first match wins."""
    active, upcoming = _active_and_next(inp.slots, now)

    # Rule 1: an approved reservation is active now.
    if active is not None:
        if active.exclusive:
            return Decision(None, Reason.ACTIVE_EXCLUSIVE, active.end, active.id)
        return Decision(active.target, Reason.ACTIVE_RESERVATION, active.end, active.id)

    if upcoming is not None:
        lead = (upcoming.start - now).total_seconds()
        # Rule 2: preload within the window (inclusive at its first moment).
        preload_lead = preload_lead_seconds(inp, upcoming)
        if lead <= preload_lead:
            reason = Reason.STOP_FOR_EXCLUSIVE if upcoming.exclusive else Reason.PRELOAD_NEXT
            return Decision(upcoming.target, reason, upcoming.start, upcoming.id)
        # Rule 3: the gap is too short to be worth loading the default. It holds
        # until rule 2 takes over with the same target and its own reason.
        gap = short_gap_seconds(inp, upcoming)
        if gap is not None and lead < gap:
            preload_from = upcoming.start - timedelta(seconds=preload_lead)
            return Decision(upcoming.target, Reason.SKIP_DEFAULT_SHORT_GAP, preload_from, upcoming.id)

    takeover = _takeover(inp, upcoming)

    # Rule 4: an admin's override, until ``until`` or the next reservation.
    override_until = override_end(inp, now)
    if inp.override is not None and override_until is not None:
        reason = Reason.MANUAL_UNLOAD if inp.override.target is None else Reason.MANUAL_OVERRIDE
        return Decision(inp.override.target, reason, _earliest(override_until, takeover))

    # Rule 5: a model loaded on demand, until released or until rule 2 or 3 claims the channel.
    if inp.on_demand is not None and on_demand_holds(inp, now):
        return Decision(inp.on_demand.target, Reason.ON_DEMAND, takeover)

    # Rule 6: the channel's default, or nothing.
    reason = Reason.DEFAULT if inp.default is not None else Reason.IDLE
    return Decision(inp.default, reason, takeover)


def decide_converged(inp: DecisionInput, now: datetime) -> Decision:
    """The decision once the channel runs what the decision asks for.

    Only rule 3 looks at what runs, so at most two rounds settle it; the loop
    bound guards against a rule change that would make it oscillate.
    """
    decision = decide(inp, now)
    for _ in range(3):
        if decision.target == inp.running:
            break
        inp = dataclasses.replace(inp, running=decision.target)
        decision = decide(inp, now)
    return decision


def plan(inp: DecisionInput, start: datetime, end: datetime) -> list[PlanSegment]:
    """The decisions from ``start`` to ``end`` as a timeline.

    The channel is assumed to run each target as soon as it is decided, so
    the decision for a later moment sees what the plan had running just
    before it. Adjacent moments with the same target and reason merge.
    """
    segments: list[PlanSegment] = []
    moment = start
    while moment < end:
        decision = decide_converged(inp, moment)
        inp = dataclasses.replace(inp, running=decision.target)
        until = decision.valid_until if decision.valid_until is not None else end
        # A rule that fires strictly after its boundary (rule 3's ``<``) gives a
        # valid_until equal to the moment itself; step past that instant.
        until = min(max(until, moment + _INSTANT), end)
        last = segments[-1] if segments else None
        if (
            last is not None
            and last.end == moment
            and (last.target, last.reason, last.reservation_id)
            == (decision.target, decision.reason, decision.reservation_id)
        ):
            segments[-1] = dataclasses.replace(last, end=until)
        else:
            segments.append(
                PlanSegment(moment, until, decision.target, decision.reason, decision.reservation_id)
            )
        moment = until
    return segments


def running_at(inp: DecisionInput, now: datetime, at: datetime) -> Target | None:
    """What the plan from ``now`` has the channel running just before ``at``."""
    if at <= now:
        return inp.running
    segments = plan(inp, now, at)
    return segments[-1].target if segments else inp.running


def decide_at(inp: DecisionInput, now: datetime, at: datetime) -> Decision:
    """The decision at any moment: for a future one, what runs is what the plan has."""
    return decide(dataclasses.replace(inp, running=running_at(inp, now, at)), at)
