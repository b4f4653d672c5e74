"""The order a channel's held requests are served in, as pure functions (docs/gateway.md, "Fair
sharing under contention").

A channel's process serves a few requests at once, its *places*. When all are taken, requests
wait in the channel's queue, and each place that frees goes to the request with the smallest
*finish tag*. This is self-clocked fair queueing (Golestani, 1994), deficit round robin's
continuous twin: each user's requests are tagged one after the other,

    tag = max(the channel's virtual time, the user's last tag) + cost / weight

where the cost is the tokens the request asks for and the channel's virtual time is the tag of
the last request served. A user who keeps ten long requests waiting has tags far ahead; a
colleague's short request arrives tagged just past the virtual time and is served at the next
freed place. A user alone still fills every place (the queue only orders; it never keeps a
place empty), and a user of long completions gets no more tokens than one of short ones.

``gateway.wire.queue_scripts`` does the same in Redis, shared by every gateway process; this module
is the specification the tests read, and the cost of a request.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# What a request costs when it does not say how many tokens it wants: about a paragraph.
DEFAULT_COST = 256
# A request asking for more than this costs this much: a whole context is not worth more turns.
MAX_COST = 32768

# The body fields in which the APIs the gateway passes on name the tokens a request may make.
TOKEN_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens", "n_predict")


def cost_of(body: Mapping[str, Any] | None) -> int:
    """The tokens a request asks for, as its cost in the queue (``DEFAULT_COST`` if unsaid)."""
    if body is not None:
        for name in TOKEN_FIELDS:
            value = body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return min(value, MAX_COST)
    return DEFAULT_COST


def finish_tag(virtual_time: float, user_last_tag: float, cost: int, weight: int) -> float:
    """A newly held request's place in the order."""
    return max(virtual_time, user_last_tag) + cost / max(weight, 1)


@dataclass
class FairQueue:
    """One channel's held requests, as ``gateway.wire.queue_scripts`` keeps them in Redis."""

    virtual_time: float = 0.0
    last_tags: dict[str, float] = field(default_factory=dict)  # per user
    _held: dict[str, tuple[float, int, str]] = field(default_factory=dict)  # name → (tag, order, user)
    _order: int = 0

    def add(self, name: str, user: str, cost: int, weight: int = 1) -> float:
        tag = finish_tag(self.virtual_time, self.last_tags.get(user, 0.0), cost, weight)
        self.last_tags[user] = tag
        self._order += 1
        self._held[name] = (tag, self._order, user)
        return tag

    def remove(self, name: str) -> None:
        """A held request whose client left: it is never served."""
        self._held.pop(name, None)

    def take(self) -> str | None:
        """The request the next freed place goes to (ties: the earlier held)."""
        if not self._held:
            return None
        name = min(self._held, key=lambda n: self._held[n][:2])
        tag, _, _ = self._held.pop(name)
        self.virtual_time = max(self.virtual_time, tag)
        return name

    def __len__(self) -> int:
        return len(self._held)

    def held_by(self, user: str) -> int:
        return sum(1 for _, _, u in self._held.values() if u == user)


@dataclass(frozen=True)
class Arrival:
    """A request as the tests tell it: who, when, what it asks for and how long it keeps a place."""

    name: str
    user: str
    at: float
    cost: int = DEFAULT_COST
    seconds: float = 1.0
    weight: int = 1


def order_served(arrivals: Iterable[Arrival], places: int) -> list[str]:
    """The order in which a channel with ``places`` starts ``arrivals``: a request goes at once
    while a place is free and nobody is held, else it is held and the fair queue chooses."""
    pending = sorted(arrivals, key=lambda a: a.at)
    queue, by_name = FairQueue(), {a.name: a for a in pending}
    busy: list[tuple[float, str]] = []  # (when its place frees, name)
    served: list[str] = []
    now, i = 0.0, 0
    while i < len(pending) or len(queue) or busy:
        # The next event: an arrival, or a place freeing (arrivals first at the same moment).
        next_arrival = pending[i].at if i < len(pending) else float("inf")
        next_free = busy[0][0] if busy else float("inf")
        if next_arrival <= next_free:
            arrival = pending[i]
            i += 1
            now = arrival.at
            queue.add(arrival.name, arrival.user, arrival.cost, arrival.weight)
        else:
            now, _ = heapq.heappop(busy)
        while len(busy) < places and len(queue):
            name = queue.take()
            assert name is not None
            served.append(name)
            heapq.heappush(busy, (now + by_name[name].seconds, name))
    return served
