"""docs/node-workers.md, "Prewarm from the calendar": the next booking's model file is read into
the page cache ahead of its load, never while a load runs or when free RAM would not hold it."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from channels_app.models import ChannelRuntime, StoryEntry
from channels_app.node_worker import page_cache, prewarm
from channels_app.scheduling.prewarm import Upcoming, choose
from slotserve_base.target import Target
from slotserve_base.vocabulary import Phase
from tests import factories

NOW = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
GB = 10**9


def booking(n: int, *, minutes: float, size: int = GB, **extra) -> Upcoming:
    return Upcoming(
        channel_id=n,
        booking_id=100 + n,
        start=NOW + timedelta(minutes=minutes),
        target=Target(n),
        path=f"/models/{n}.gguf",
        size_bytes=size,
        **extra,
    )


def chosen(upcoming, *, loading=False, available=64 * GB, done=()):
    return choose(
        upcoming,
        now=NOW,
        horizon=timedelta(minutes=30),
        loading=loading,
        available_bytes=available,
        reserve_bytes=GB,
        done=done,
    )


def test_the_soonest_booking_within_the_horizon_is_read_first():
    first, later, far = booking(1, minutes=20), booking(2, minutes=5), booking(3, minutes=45)
    assert chosen([first, later, far]) == later
    assert chosen([far]) is None  # beyond the horizon
    assert chosen([booking(4, minutes=-1)]) is None  # already begun: its load is under way
    assert chosen([later, first], done={later.key}) == first  # read once per booking and file


def test_nothing_is_read_while_a_load_runs_or_when_free_ram_would_not_hold_the_file():
    soon = booking(1, minutes=5, size=8 * GB)
    assert chosen([soon], loading=True) is None
    assert chosen([soon], available=9 * GB - 1) is None  # 8 GB + 1 GB to spare do not fit
    assert chosen([soon], available=9 * GB) == soon
    smaller = booking(2, minutes=10, size=2 * GB)
    assert chosen([soon, smaller], available=4 * GB) == smaller


def test_a_model_that_runs_or_whose_preload_began_needs_no_prewarm():
    assert chosen([booking(1, minutes=5, running=Target(1))]) is None
    assert chosen([booking(1, minutes=5, decided=Target(1))]) is None
    assert chosen([booking(1, minutes=5, running=Target(9), decided=Target(9))]) is not None


def resident_fraction(path: Path) -> float:
    """The share of the file's pages in the page cache, as util-linux's fincore reports it."""
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES,SIZE", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return int(out[0]) / int(out[1])


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    with path.open("wb") as file:
        for _ in range(48):
            file.write(b"\x5a" * 2**20)
    page_cache.evict(path)
    return path


def test_a_read_fills_the_page_cache_and_eviction_empties_it(model_file: Path):
    if resident_fraction(model_file) > 0.1:
        pytest.skip("this filesystem keeps the file cached despite DONTNEED (tmpfs)")
    read = page_cache.read_into_cache(model_file, mbps=0, reserve_bytes=0)
    assert (read.bytes, read.complete) == (48 * 2**20, True)
    assert resident_fraction(model_file) > 0.95
    page_cache.evict(model_file)
    assert resident_fraction(model_file) < 0.1


def test_a_read_keeps_to_its_speed_and_stops_when_told_or_when_memory_runs_short(model_file: Path):
    moment = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        moment[0] += seconds

    read = page_cache.read_into_cache(
        model_file, mbps=8, reserve_bytes=0, clock=lambda: moment[0], sleep=sleep
    )
    assert read.complete and read.seconds == pytest.approx(48 * 2**20 / 8e6)  # 8 MB/s, not faster
    assert len(slept) == 6

    chunks = iter(range(100))
    stopped = page_cache.read_into_cache(model_file, mbps=0, reserve_bytes=0, stop=lambda: next(chunks) >= 2)
    assert (stopped.bytes, stopped.complete, stopped.why) == (
        2 * page_cache.CHUNK_BYTES,
        False,
        "a load began",
    )
    short = page_cache.read_into_cache(model_file, mbps=0, reserve_bytes=GB, free=lambda: GB - 1)
    assert (short.bytes, short.complete, short.why) == (0, False, "free memory ran short")


def test_available_bytes_reads_memavailable(tmp_path: Path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n")
    assert page_cache.available_bytes(meminfo) == 20_000_000 * 1024
    assert page_cache.available_bytes() > 0  # this machine's


@pytest.fixture
def upcoming_booking(db, model_file: Path):
    node = factories.node("warm", gpus=2)
    model = factories.llm("next-model", size=model_file.stat().st_size, path=str(model_file))
    running = factories.llm("running-model")
    channel = factories.channel("ch", on=node)
    ChannelRuntime.objects.create(channel=channel, phase=Phase.READY, model=running)
    start = timezone.now() + timedelta(minutes=10)
    return factories.reservation(
        owner=factories.user("ana"),
        on=channel,
        start=start,
        end=start + timedelta(hours=1),
        target=factories.preset(model, "greedy"),
    )


def finish(begun: prewarm.Prewarm | None) -> StoryEntry:
    assert begun is not None, "no prewarm began"
    begun.thread.join(timeout=30)
    assert not begun.thread.is_alive()
    return StoryEntry.objects.get(channel_id=begun.booking.channel_id, kind="prewarmed")


@pytest.mark.django_db(transaction=True)
def test_the_node_reads_its_next_bookings_file_once_and_tells_the_story(
    upcoming_booking, model_file, staff_api
):
    told = finish(prewarm.tend("warm", timezone.now()))
    size = model_file.stat().st_size
    assert (told.data["booking_id"], told.data["bytes"], told.data["complete"]) == (
        upcoming_booking.pk,
        size,
        True,
    )
    if resident_fraction(model_file) < 0.9:  # a filesystem that keeps no page cache (none here)
        pytest.fail("the file was read but is not in the page cache")
    assert prewarm.tend("warm", timezone.now()) is None  # once per booking and file

    story = staff_api.get(f"/api/channels/{upcoming_booking.channel_id}/story?booking={upcoming_booking.pk}")
    words = [line["words"] for line in story.data["lines"] if line["kind"] == "prewarmed"]
    local = upcoming_booking.start.astimezone(timezone.get_current_timezone())
    assert words == [
        f"Prewarmed next-model (greedy)'s file for ana's {local:%H:%M} booking: 50 MB in under a second "
        "read into memory ahead of its load."
    ]


@pytest.mark.django_db(transaction=True)
def test_no_prewarm_while_a_load_runs_or_when_ram_is_short_and_a_load_stops_one(
    upcoming_booking, monkeypatch, settings
):
    channel = upcoming_booking.channel
    other = factories.channel("other", on=channel.node, gpu_indexes=[1])
    ChannelRuntime.objects.create(channel=other, phase=Phase.LOADING, model=factories.llm("loads"))
    assert prewarm.tend("warm", timezone.now()) is None  # a load runs on the node

    ChannelRuntime.objects.filter(channel=other).update(phase=Phase.READY)
    monkeypatch.setattr(page_cache, "available_bytes", lambda: prewarm.RESERVE_BYTES + 2**20)
    assert prewarm.tend("warm", timezone.now()) is None  # free RAM would not hold the file
    monkeypatch.undo()

    settings.SLOTSERVE_PREWARM_MBPS = 5  # ten seconds for the file: a load begins meanwhile
    begun = prewarm.tend("warm", timezone.now())
    ChannelRuntime.objects.filter(channel=other).update(phase=Phase.LOADING)
    assert prewarm.tend("warm", timezone.now()) is None  # sees the load, stops the read
    told = finish(begun)
    assert (told.data["complete"], told.data["why"]) == (False, "a load began")
    assert told.data["bytes"] < model_file_size(upcoming_booking)


def model_file_size(booked) -> int:
    return Path(booked.model.path).stat().st_size


@pytest.mark.django_db(transaction=True)
def test_a_load_that_begins_stops_the_prewarm_at_once(upcoming_booking, settings):
    settings.SLOTSERVE_PREWARM_MBPS = 5
    begun = prewarm.tend("warm", timezone.now())
    prewarm.yield_to_load()  # what the node worker's launch of any process does first
    told = finish(begun)
    assert (told.data["complete"], told.data["why"]) == (False, "a load began")
