"""Which channel may load a model on demand (docs/scheduling.md, "Loaded on demand"), as pure
functions: the on-demand rules remove channels first, each naming why, then placement's own
chain (``channels_app.placement.chains.place``) filters and ranks the rest."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from channels_app.placement.chains import (
    Candidate,
    Need,
    Placement,
    ScoreMaximums,
    fit_parts,
    place,
)
from channels_app.scheduling.decision import DecisionInput, OnDemandFacts, decide
from slotserve_base.vocabulary import Reason


@dataclass(frozen=True)
class OnDemandChannel:
    """A channel as an on-demand load sees it, beside placement's ``Candidate``."""

    candidate: Candidate
    serves_on_demand: bool
    admits_caller: bool
    decision_input: DecisionInput  # the channel's decision inputs now
    load_seconds: float  # the wanted model's load estimate on the channel's node
    default_in_flight: int = 0  # requests in flight on what runs now


DEFAULT_MAXIMUMS = ScoreMaximums()

# Why the channel's own decision keeps the load out, by the reason it gives instead.
_HELD_BY = {
    Reason.ACTIVE_RESERVATION: "booked now",
    Reason.ACTIVE_EXCLUSIVE: "booked now",
    Reason.PRELOAD_NEXT: "preloading the next booking",
    Reason.STOP_FOR_EXCLUSIVE: "preloading the next booking",
    Reason.SKIP_DEFAULT_SHORT_GAP: "preloading the next booking",
    Reason.MANUAL_OVERRIDE: "held by an admin's override",
    Reason.MANUAL_UNLOAD: "held by an admin's override",
}

# The rules' names, in their order, and how a count of removals reads.
RULES = ("opted_out", "caller", "held", "soon", "busy")
_WORDS = {  # (one, several)
    "opted_out": ("does not serve on demand", "do not serve on demand"),
    "caller": ("not yours to use", "not yours to use"),
    "held": ("is held by a booking or an override", "are held by a booking or an override"),
    "soon": ("is booked too soon", "are booked too soon"),
    "busy": ("serves its default to others now", "serve their default to others now"),
}


def _why_not(
    c: OnDemandChannel, wanted: Need, now: datetime, min_stay_seconds: float
) -> tuple[str, str] | None:
    """The first rule that keeps the load off the channel: (rule, why), or None."""
    if not c.serves_on_demand:
        return "opted_out", "does not serve on demand"
    if not c.admits_caller:
        return "caller", "not yours to use (its groups, or your key's channels)"
    inp = c.decision_input
    if inp.on_demand is not None:
        return "held", "runs another model loaded on demand"
    facts = OnDemandFacts(wanted.target, now)
    decision = decide(dataclasses.replace(inp, on_demand=facts, running=wanted.target), now)
    if decision.reason != Reason.ON_DEMAND:
        return "held", _HELD_BY.get(decision.reason, str(decision.reason))
    needed = now + timedelta(seconds=c.load_seconds + min_stay_seconds)
    if decision.valid_until is not None and decision.valid_until < needed:
        return "soon", f"booked from {decision.valid_until:%H:%M:%S} UTC on"
    if c.default_in_flight > 0 and inp.running is not None:
        return "busy", f"its default serves {c.default_in_flight} request(s) now"
    return None


def on_demand_placement(
    channels: Sequence[OnDemandChannel],
    wanted: Need,
    *,
    now: datetime,
    min_stay_seconds: float,
    policy: str = "binpack",
    maximums: ScoreMaximums = DEFAULT_MAXIMUMS,
) -> Placement:
    """The channels that may load ``wanted`` on demand now, best first; when none, the message
    counts every reason in the seed's form ("0/3 channels: 1 is booked too soon, …")."""
    removed: dict[str, list[tuple[str, str]]] = {}
    kept: list[Candidate] = []
    for channel in channels:
        why = _why_not(channel, wanted, now, min_stay_seconds)
        if why is None:
            kept.append(channel.candidate)
        else:
            removed.setdefault(why[0], []).append((channel.candidate.name, why[1]))
    placed = place(kept, wanted, policy=policy, maximums=maximums)
    removed.update(placed.removed)
    if placed.ranked:
        return dataclasses.replace(placed, removed=removed)
    parts = [_count(name, removed[name]) for name in RULES if removed.get(name)]
    parts += fit_parts(placed.removed)
    message = f"0/{len(channels)} channels: " + ", ".join(parts) if parts else f"0/{len(channels)} channels"
    return Placement([], removed, message)


def _count(name: str, entries: list[tuple[str, str]]) -> str:
    one, several = _WORDS[name]
    return f"{len(entries)} {one if len(entries) == 1 else several}"
