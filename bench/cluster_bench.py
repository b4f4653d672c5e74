#!/usr/bin/env python
"""Benchmark: is the booked model ready when a slot starts, on a cluster of two GPU nodes?

    sudo .venv/bin/python bench/cluster_bench.py [--bookings 60] [--hour-seconds 10] [--seed 7]

Needs root (network namespaces) and PostgreSQL (``DATABASE_URL``, default the local server; a
database ``slotserve_bench`` is created afresh). Two GPU nodes, each in its own namespace with
four fake GPUs (eight channels), run ``manage.py nodeworker``; the control host runs
``manage.py run --no-node`` (scheduler tick 1 s); Redis and PostgreSQL are reached over the
bridge. Every model runs as the stand-in server with a load time of 1-5 s.

A day of bookings (1-3 hours each, gaps of 0-2 hours, each channel's default model between
them) is compressed so that an hour lasts ``--hour-seconds``. The benchmark samples every
channel's state every 50 ms and reports, per booking, whether its model was ready when the slot
began and, if not, how late; the goal is every booking whose gap to the previous one on its
channel was at least its model's load time. Then node B's link goes down and the time until the
node is ``not_ready`` (what the overview shows) is measured.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SUBNET = "10.231.78"
NODES = {"bench-a": 21, "bench-b": 22}
GPUS_PER_NODE = 4
LOAD_SECONDS = [1, 2, 3, 4, 5]  # one model per load time


@dataclass
class Booking:
    channel: str
    start: datetime
    end: datetime
    load: int  # the booked model's load time, seconds
    gap: float  # seconds since the previous booking on the channel ended (or since the day began)
    reservation_id: int = 0


def plan_day(
    channels: list[str], count: int, hour: float, day_start: datetime, rng: random.Random
) -> list[Booking]:
    """``count`` bookings spread over the channels, one day long at ``hour`` seconds an hour."""
    bookings: list[Booking] = []
    free_at = dict.fromkeys(channels, day_start)
    for number in range(count):
        name = channels[number % len(channels)]
        gap = rng.choice([0, 0, 0.25, 0.5, 1, 2]) * hour
        if free_at[name] == day_start:
            gap = max(gap, 2 * hour)  # the first of a channel: time for its first load
        start = free_at[name] + timedelta(seconds=gap)
        end = start + timedelta(seconds=rng.choice([1, 1.5, 2, 3]) * hour)
        bookings.append(Booking(name, start, end, rng.choice(LOAD_SECONDS), gap))
        free_at[name] = end
    return bookings


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bookings", type=int, default=60)
    parser.add_argument("--hour-seconds", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    from devtools.cluster import (
        Cluster,
        Forwarder,
        namespaces_work,
        node_worker_env,
        redis_answers,
        redis_executable,
        start_node_worker,
        stop_inference_processes,
    )

    why = namespaces_work()
    if why:
        sys.exit(f"cluster_bench: {why}")
    base_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    db = urlsplit(base_url)
    if not db.scheme.startswith("postgres"):
        sys.exit("cluster_bench: DATABASE_URL must name a PostgreSQL server (several machines share one)")
    subprocess.run(
        ["psql", base_url, "-qc", "DROP DATABASE IF EXISTS slotserve_bench"], check=True, capture_output=True
    )
    subprocess.run(
        ["psql", base_url, "-qc", "CREATE DATABASE slotserve_bench"], check=True, capture_output=True
    )

    work = Path(tempfile.mkdtemp(prefix="slotserve-cluster-bench-"))
    tag = secrets.token_hex(2)
    net = Cluster(tag, SUBNET)
    started: list[subprocess.Popen[bytes]] = []
    forwarder = None
    try:
        net.up()
        redis_port, redis_password = 16399, secrets.token_urlsafe(12)
        started.append(
            subprocess.Popen(
                [
                    redis_executable(),
                    *("--bind", net.control, "--port", str(redis_port), "--save", "", "--appendonly", "no"),
                    *("--requirepass", redis_password, "--dir", str(work)),
                ],
                stdout=subprocess.DEVNULL,
            )
        )
        forwarder = Forwarder((net.control, 15432), (db.hostname or "127.0.0.1", db.port or 5432))
        forwarder.start()
        redis_url = f"redis://:{redis_password}@{net.control}:{redis_port}/0"
        database_url = f"{db.scheme}://{db.username or 'postgres'}@{net.control}:15432/slotserve_bench"
        for _ in range(50):
            if redis_answers(redis_url):
                break
            time.sleep(0.1)
        common = {
            "PATH": os.environ.get("PATH", ""),
            "PYTHONUNBUFFERED": "1",
            "DJANGO_SETTINGS_MODULE": "slotserve_site.settings",
            "DATABASE_URL": database_url,
            "SLOTSERVE_REDIS_URL": redis_url,
            "SLOTSERVE_REDIS_PREFIX": f"bench{tag}",
            "SLOTSERVE_SECRET_KEY": secrets.token_urlsafe(32),
            "SLOTSERVE_TICK_SECONDS": "1",
            # A compressed day: the real 180 s minimum preload would be 18 compressed hours.
            "SLOTSERVE_MIN_PRELOAD_SECONDS": "0",
            "SLOTSERVE_LOG_LEVEL": "WARNING",
        }
        os.environ.update(common)
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

        models_dir = work / "models"
        models_dir.mkdir()
        control_home = work / "control"
        control_home.mkdir()
        started.append(
            subprocess.Popen(
                [sys.executable, "manage.py", "run", "--no-node", "--host", net.control, "--port", "18080"],
                cwd=ROOT,
                env={**common, "HOME": str(control_home), "SLOTSERVE_DATA_DIR": str(control_home / "data")},
                stdout=(control_home / "run.log").open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        for name, host in NODES.items():
            namespace = net.add_node(name, host)
            home = work / name
            home.mkdir()
            env = node_worker_env(common, home, name, f"{net.subnet}.{host}", GPUS_PER_NODE, models_dir)
            started.append(start_node_worker(namespace, name, env, home / "node-worker.log", ROOT))
        run_day(args, models_dir, net)
    finally:
        stop_inference_processes()
        for process in reversed(started):
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGINT)
                except (ProcessLookupError, PermissionError):
                    process.kill()
        for process in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        try:
            if forwarder is not None:
                forwarder.stop()
        finally:
            net.down()  # whatever failed before, the bridge and namespaces go


def run_day(args: argparse.Namespace, models_dir: Path, net: Any) -> None:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from channels_app.models import Channel, ChannelRuntime, LLMModel, Node, Preset
    from reservations.models import Reservation, ReservationStatus

    deadline = time.monotonic() + 60
    while Node.objects.filter(name__in=NODES, gpus__isnull=False).distinct().count() < len(NODES):
        if time.monotonic() > deadline:
            sys.exit("cluster_bench: the nodes did not register within 60 s")
        time.sleep(0.2)
    presets: dict[int, Preset] = {}
    for load in LOAD_SECONDS:
        path = models_dir / f"load-{load}s.gguf"
        path.write_bytes(b"GGUF")
        model = LLMModel.objects.create(
            name=f"load-{load}s", backend="llama.cpp", path=str(path), size_bytes=4
        )
        presets[load] = Preset.objects.create(
            model=model, name="bench", args=f"--standin-load-seconds {load}"
        )
    default = presets[1]
    channels = []
    for node in Node.objects.filter(name__in=NODES).order_by("name"):
        for index in range(GPUS_PER_NODE):
            channels.append(
                Channel.objects.create(
                    name=f"{node.name}-{index}",
                    node=node,
                    gpu_indexes=[index],
                    default_model=default.model,
                    default_preset=default,
                    min_booking_minutes=0,
                )
            )
    owner = get_user_model().objects.create_user("bench", password=secrets.token_urlsafe(12))
    hour = args.hour_seconds
    day_start = timezone.now() + timedelta(seconds=5)
    bookings = plan_day([c.name for c in channels], args.bookings, hour, day_start, random.Random(args.seed))
    by_name = {c.name: c for c in channels}
    for booking in bookings:
        booking.reservation_id = Reservation.objects.create(
            user=owner,
            channel=by_name[booking.channel],
            start=booking.start,
            end=booking.end,
            model=presets[booking.load].model,
            preset=presets[booking.load],
            status=ReservationStatus.APPROVED,
        ).pk
    day_end = max(b.end for b in bookings)
    print(
        f"{len(bookings)} bookings on {len(channels)} channels over "
        f"{(day_end - day_start).total_seconds() / hour:.1f} compressed hours "
        f"({(day_end - day_start).total_seconds():.0f} s); sampling every 50 ms…",
        flush=True,
    )
    # (channel id, preset id) → moments it was seen ready, sampled every 50 ms.
    samples: list[tuple[datetime, dict[int, int]]] = []
    while timezone.now() < day_end:
        now = timezone.now()
        ready = dict(ChannelRuntime.objects.filter(phase="ready").values_list("channel_id", "preset_id"))
        samples.append((now, ready))
        time.sleep(0.05)

    on_time, late, goal_met, goal_total = 0, [], 0, 0
    missed: list[str] = []
    for booking in bookings:
        channel_id, preset_id = by_name[booking.channel].pk, presets[booking.load].pk
        during = [
            (moment, ready.get(channel_id) == preset_id)
            for moment, ready in samples
            if booking.start <= moment <= booking.end
        ]
        ready_at_start = bool(during) and during[0][1]  # the first sample of the slot (≤ 50 ms in)
        if ready_at_start:
            on_time += 1
        else:
            first_ready = next((moment for moment, ready in during if ready), booking.end)
            late.append((first_ready - booking.start).total_seconds())
        if booking.gap >= booking.load:
            goal_total += 1
            goal_met += ready_at_start
            if not ready_at_start:
                missed.append(
                    f"{booking.channel} gap {booking.gap:.1f} s load {booking.load} s late {late[-1]:.2f} s"
                )
    print(f"ready at the slot's start: {on_time}/{len(bookings)} ({100 * on_time / len(bookings):.0f} %)")
    share = 100 * goal_met / max(goal_total, 1)
    print(f"  of those whose gap was at least the load time: {goal_met}/{goal_total} ({share:.0f} %)")
    for line in missed:
        print(f"    missed: {line}")
    if late:
        late.sort()
        p99 = late[min(len(late) - 1, round(0.99 * (len(late) - 1)))]
        p50 = statistics.median(late)
        print(f"  the others: {len(late)}, lateness p50 {p50:.2f} s, p99 {p99:.2f} s, max {late[-1]:.2f} s")

    node_b = Node.objects.get(name="bench-b")
    net.link("bench-b", up=False)
    cut = time.monotonic()
    while Node.objects.get(pk=node_b.pk).is_ready(timezone.now()):
        time.sleep(0.05)
    print(f"node bench-b link down → not_ready on the overview: {time.monotonic() - cut:.2f} s (tick 1 s)")


if __name__ == "__main__":
    main()
