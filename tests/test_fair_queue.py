"""The order a channel's held requests are served in (gateway.rules.fair_queue), as a table:
the requests that arrive, the places of the process → the order in which they start."""

from __future__ import annotations

import pytest

from gateway.rules.fair_queue import DEFAULT_COST, MAX_COST, Arrival, FairQueue, cost_of, order_served


def flood(user: str, count: int, *, at: float = 0.0, cost: int = 2000, seconds: float = 10) -> list[Arrival]:
    return [Arrival(f"{user}{n}", user, at, cost, seconds) for n in range(1, count + 1)]


@pytest.mark.parametrize(
    ("arrivals", "places", "served"),
    [
        pytest.param(
            flood("a", 4, seconds=1),
            2,
            ["a1", "a2", "a3", "a4"],
            id="one user alone fills every place, in their own order",
        ),
        pytest.param(
            [*flood("a", 10), Arrival("b1", "b", 0.5, cost=16, seconds=0.1)],
            2,
            ["a1", "a2", "b1", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "a10"],
            id="a colleague's short request takes the first place that frees behind a batch",
        ),
        pytest.param(
            [
                *flood("a", 6, cost=2000, seconds=1),
                *[Arrival(f"b{n}", "b", 0.0, cost=500, seconds=1) for n in range(1, 7)],
            ],
            1,
            ["a1", "b1", "b2", "b3", "a2", "b4", "b5", "b6", "a3", "a4", "a5", "a6"],
            id="tokens, not requests, are shared: short requests take several turns for a long one",
        ),
        pytest.param(
            [
                *[Arrival(f"a{n}", "a", 0.0, cost=100, weight=2) for n in range(1, 5)],
                *[Arrival(f"b{n}", "b", 0.0, cost=100) for n in range(1, 5)],
            ],
            1,
            ["a1", "a2", "a3", "b1", "a4", "b2", "b3", "b4"],
            id="a weight of 2 gets two turns for one",
        ),
        pytest.param(
            [
                *[Arrival(f"a{n}", "a", 0.0, cost=100) for n in range(1, 4)],
                *[Arrival(f"b{n}", "b", 0.0, cost=100) for n in range(1, 4)],
                *[Arrival(f"c{n}", "c", 0.0, cost=100) for n in range(1, 4)],
            ],
            1,
            ["a1", "a2", "b1", "c1", "a3", "b2", "c2", "b3", "c3"],
            id="equal users take turns",
        ),
        pytest.param(
            [Arrival("a1", "a", 0.0), Arrival("b1", "b", 5.0), Arrival("a2", "a", 5.5)],
            2,
            ["a1", "b1", "a2"],
            id="a free place is taken at once",
        ),
        pytest.param(
            [
                *flood("a", 3, at=0.0, cost=100, seconds=1),
                *[Arrival(f"a{n}", "a", 30.0, cost=100) for n in range(4, 7)],
                *[Arrival(f"b{n}", "b", 30.0, cost=100) for n in range(1, 4)],
            ],
            1,
            ["a1", "a2", "a3", "a4", "a5", "b1", "a6", "b2", "b3"],
            id="a user gains no credit by having been away",
        ),
    ],
)
def test_the_order_served(arrivals, places, served):
    assert order_served(arrivals, places) == served


def test_a_request_whose_client_left_is_never_served():
    queue = FairQueue()
    for name in ("a1", "a2", "a3"):
        queue.add(name, "a", 100)
    queue.remove("a2")
    assert [queue.take(), queue.take(), queue.take()] == ["a1", "a3", None]


def test_an_idle_user_starts_at_the_channels_virtual_time_not_behind_it():
    queue = FairQueue()
    for n in range(5):
        queue.add(f"a{n}", "a", 100)
    for _ in range(4):
        queue.take()
    # b's first request ranks with a's next, not ahead of all of a's future ones forever.
    assert queue.add("b0", "b", 100) == queue.virtual_time + 100
    assert queue.held_by("a") == 1 and queue.held_by("b") == 1


@pytest.mark.parametrize(
    ("body", "cost"),
    [
        ({"max_tokens": 16}, 16),
        ({"max_completion_tokens": 40, "max_tokens": 16}, 40),
        ({"max_output_tokens": 300}, 300),
        ({"n_predict": 8}, 8),
        ({"max_tokens": 10**9}, MAX_COST),
        ({"max_tokens": 0}, DEFAULT_COST),
        ({"max_tokens": True}, DEFAULT_COST),
        ({"max_tokens": "16"}, DEFAULT_COST),
        ({}, DEFAULT_COST),
        (None, DEFAULT_COST),
    ],
)
def test_a_request_costs_the_tokens_it_asks_for(body, cost):
    assert cost_of(body) == cost
