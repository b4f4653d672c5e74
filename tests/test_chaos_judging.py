"""The chaos week's plan and judging (``bench/chaos_week.py``), checked without running the lab:
what the benchmark books must be what it judges, and a fault excuses only what it causes."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import random
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
    by_channel: dict[str, list[Any]] = {}
    for slot in sorted(plan, key=lambda s: s.start):
        by_channel.setdefault(slot.channel, []).append(slot)
    for slots in by_channel.values():  # still one after another on each channel, never overlapping
        assert all(a.end <= b.start for a, b in itertools.pairwise(slots))


def test_a_late_first_token_is_excused_only_by_a_fault_on_its_way():
    """The booker's first token within 2 s is promise 1's guard against waiting behind others; a
    request stalled by its node's link cut, or by PostgreSQL or Redis restarting, waited for the
    fault. Another node's cut, a killed web process, a fault before or after: not excused."""
    chaos = _chaos_week()
    lab = chaos.Lab()
    lab.began = 1000.0
    lab.faults = [
        chaos.Fault("cut link long", 10.0, "chaos-a", recovered_after=5.0),
        chaos.Fault("kill web", 30.0, "123", pid=123, recovered_after=5.0),
        chaos.Fault("restart redis", 50.0, recovered_after=2.0),
    ]
    assert chaos.on_its_path(lab, "chaos-a", 1012.0, 1014.0)  # in flight through the cut
    assert chaos.on_its_path(lab, "chaos-a", 1008.0, 1010.5)  # began before it, stalled by it
    assert not chaos.on_its_path(lab, "chaos-b", 1012.0, 1014.0)  # the other node's link was up
    assert not chaos.on_its_path(lab, "chaos-a", 1016.0, 1018.0)  # after the link came back
    assert not chaos.on_its_path(lab, "chaos-a", 1031.0, 1034.0)  # a web process killed
    assert chaos.on_its_path(lab, "chaos-b", 1049.0, 1051.0)  # Redis, on every request's way
