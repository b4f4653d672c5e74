"""The chaos week's plan of the lab's bookings (``bench/chaos_week.py``), checked without running
the lab: what the benchmark books must be what it judges."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import random
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _chaos_week():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("chaos_week_plan", ROOT / "bench" / "chaos_week.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_planned_booking_begins_and_ends_on_a_whole_second_as_the_portal_books_it():
    """The portal's booking form takes whole seconds: a slot planned half a second into one was
    booked half a second earlier than the benchmark judged it, and the booking before it ended
    half a second before the next one's planned start (a preload that began 0.5 s before it, a
    miss of promise 5 that was the benchmark's own). An hour of 21 s makes half-hour steps of
    10.5 s."""
    chaos = _chaos_week()
    args = argparse.Namespace(hour_seconds=21.0, days=7, bookings=300)
    begin = datetime(2026, 12, 7, 9, 0, 0, tzinfo=UTC)
    channels = [f"chaos-{n}-{i}" for n in "ab" for i in range(4)]
    plan = chaos.plan_week(channels, [f"user{i}" for i in range(10)], args, random.Random(2), begin)
    assert len(plan) > 250
    assert all(slot.start.microsecond == 0 and slot.end.microsecond == 0 for slot in plan), [
        (slot.start, slot.end) for slot in plan if slot.start.microsecond or slot.end.microsecond
    ][:3]
    by_channel: dict[str, list] = {}
    for slot in sorted(plan, key=lambda s: s.start):
        by_channel.setdefault(slot.channel, []).append(slot)
    for slots in by_channel.values():  # still one after another on each channel, never overlapping
        assert all(a.end <= b.start for a, b in itertools.pairwise(slots))
