#!/usr/bin/env python
"""Benchmark: the portal and REST API of a lab under load, with up to a year of data.

    .venv/bin/python bench/portal_load.py [--sizes small,medium] [--requests 20] [--users 20,50]
        [--seconds 15] [--seed 7] [--log-order random|time] [--think 2,5] [--web-processes N] [--reuse]
        [--catch-up background|command] [--burst 1000]

Needs PostgreSQL (``DATABASE_URL``, default the local server; a database ``slotserve_portal_bench``
is made afresh for each size) and Redis (``SLOTSERVE_REDIS_URL``, default the local one). For
each size a deterministic generator fills the database through the ORM (bulk inserts):

    size     nodes  channels  users  bookings (a year)  request-log rows
    small        5        20     50              2,000            20,000
    medium      20        80    300             20,000           300,000
    large       50       200  1,000            100,000         2,000,000

The request log is written in no time order, as a restore or an import writes it (``--log-order
time``: in the order the requests came, as the gateway writes it): a mass of rows that usage counts
in the background. The benchmark times a usage page while that backlog waits, then catches it up
as a lab does, by the scheduler's worker, timing the usage pages and API all the while (``--catch-up
command``: with ``manage.py catch_up_usage``, its time, rows a second and peak memory). Then
``manage.py run --no-node`` (the one-command start's web server and scheduler) serves it, and
the benchmark reports for each page and API call, as a signed-in staff member: p50 and p95 over
``--requests`` calls, the web processes' CPU time a call, and the SQL queries it makes (counted
in this process, on the same database); the scheduler tick's time and queries; the request log's
CSV export in rows per second; and ``--users`` colleagues browsing at once for ``--seconds``
(requests per second, p95, errors, PostgreSQL connections at the peak); with ``--burst N``, N
people opening the calendar within one second, each on a connection of its own (the whole lab at
nine). Last, the web server's resident memory.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ObjectDoesNotExist

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZES: dict[str, dict[str, int]] = {
    "small": {"nodes": 5, "channels": 20, "users": 50, "bookings": 2_000, "log": 20_000},
    "medium": {"nodes": 20, "channels": 80, "users": 300, "bookings": 20_000, "log": 300_000},
    "large": {"nodes": 50, "channels": 200, "users": 1_000, "bookings": 100_000, "log": 2_000_000},
}
DATABASE = "slotserve_portal_bench"
PAGES = [
    "/",
    "/calendar/",
    "/calendar/?view=week",
    "/reservations/",
    "/approvals/",
    "/usage/?by=user&period=week",
    "/usage/?by=channel&period=week",
    "/api/reservations/",
    "/api/channels/",
    "/api/usage/?by=channel&period=week",
    "/requests/",
    "/keys/",
    "/calendar/?view=agenda",
    "/audit/",
    "/calendar/?view=month",
    "/closures/",
    "/people/",
    "/playground/",
    "/api/blackouts/",
]


def fill(size: dict[str, int], seed: int, log_order: str = "random") -> dict[str, Any]:
    """The size's data, the same for the same seed: nodes of four GPUs, a channel per GPU with a
    default, users in ten groups, bookings over the last eleven months and the next one (a tenth
    of the future ones pending), and request-log rows over the last month."""
    from django.contrib.auth.models import Group, User
    from django.utils import timezone

    from channels_app.models import Channel, Gpu, LLMModel, LoadRecord, Node, Preset
    from gateway.models import RequestLog
    from gateway.usage.rollups import roll_up
    from reservations.models import Reservation, ReservationStatus

    rng = random.Random(seed)
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    nodes = Node.objects.bulk_create(
        Node(name=f"gpu{n:02d}", last_heartbeat=now) for n in range(size["nodes"])
    )
    Gpu.objects.bulk_create(
        Gpu(node=node, index=i, name="Bench GPU", memory_bytes=80 * 2**30) for node in nodes for i in range(4)
    )
    models = LLMModel.objects.bulk_create(
        LLMModel(
            name=f"model-{m}", backend="llama.cpp", path=f"/models/m{m}.gguf", size_bytes=(4 + m) * 10**9
        )
        for m in range(12)
    )
    presets = Preset.objects.bulk_create(Preset(model=model, name="chat", args="-c 4096") for model in models)
    channels = []
    for n in range(size["channels"]):
        preset = presets[n % len(presets)]
        channel = Channel(
            name=f"ch{n:03d}",
            node=nodes[(n // 4) % len(nodes)],
            gpu_indexes=[n % 4],
            approval_policy="all" if n % 5 == 0 else "none",
            default_model=preset.model,
            default_preset=preset,
        )
        channel.save()  # its GPU claim too
        channels.append(channel)
    LoadRecord.objects.bulk_create(
        LoadRecord(
            model=p.model,
            preset=p,
            node=node,
            channel=channels[0],
            started=now - timedelta(days=1),
            finished=now - timedelta(days=1) + timedelta(seconds=30 + 5 * i),
            succeeded=True,
        )
        for i, p in enumerate(presets)
        for node in nodes[:3]
    )
    groups = Group.objects.bulk_create(Group(name=f"lab-{g}") for g in range(10))
    users = User.objects.bulk_create(
        User(username=f"person{u:04d}", email=f"person{u:04d}@lab.example", password="!")
        for u in range(size["users"])
    )
    User.groups.through.objects.bulk_create(
        User.groups.through(user_id=user.pk, group_id=groups[i % len(groups)].pk)
        for i, user in enumerate(users)
    )
    staff = User.objects.create_user(
        "bench-staff", password=secrets.token_urlsafe(12), is_staff=True, is_superuser=True
    )
    # Bookings: on each channel back to back with gaps, from 330 days ago to 30 days ahead.
    per_channel = max(1, size["bookings"] // len(channels))
    span_hours = 360 * 24
    step = span_hours / per_channel
    bookings = []
    for channel in channels:
        for b in range(per_channel):
            start = now - timedelta(days=330) + timedelta(hours=int(b * step))
            hours = rng.choice((1, 2, 3))
            if hours >= step:
                hours = 1
            preset = presets[rng.randrange(len(presets))]
            future = start > now
            status = (
                ReservationStatus.PENDING
                if future and rng.random() < 0.1
                else (
                    ReservationStatus.APPROVED
                    if future or start + timedelta(hours=hours) > now
                    else ReservationStatus.ENDED
                )
            )
            bookings.append(
                Reservation(
                    user=users[rng.randrange(len(users))],
                    channel=channel,
                    start=start,
                    end=start + timedelta(hours=hours),
                    model=preset.model,
                    preset=preset,
                    status=status,
                )
            )
    for chunk in range(0, len(bookings), 5000):
        Reservation.objects.bulk_create(bookings[chunk : chunk + 5000])
    # The log as a restore or an import of old logs writes it: in no time order (``--log-order
    # time``: as the gateway writes it, in the order the requests came).
    moments = [now - timedelta(seconds=rng.randrange(30 * 24 * 3600)) for _ in range(size["log"])]
    if log_order == "time":
        moments.sort()
    batch: list[RequestLog] = []
    for at in moments:
        batch.append(
            RequestLog(
                at=at,
                user=users[rng.randrange(len(users))],
                channel=channels[rng.randrange(len(channels))],
                model=models[rng.randrange(len(models))].name,
                method="POST",
                path="/v1/chat/completions",
                status=200,
                ttft_ms=rng.uniform(20, 400),
                duration_ms=rng.uniform(200, 20_000),
                prompt_tokens=rng.randrange(10, 2000),
                completion_tokens=rng.randrange(10, 800),
            )
        )
        if len(batch) == 10_000:
            RequestLog.objects.bulk_create(batch)
            batch = []
    RequestLog.objects.bulk_create(batch)
    # Written straight to the table, the rows are rolled up here, as the flush would have: a
    # mass of them is set aside as the backlog (caught up in run_size).
    started = time.monotonic()
    rolled = roll_up()
    print(f"   rolled up {rolled:,} request-log rows in {time.monotonic() - started:.1f} s", flush=True)
    return {"staff": staff, "users": users}


def catch_up_backlog(page: Any, how: str) -> None:
    """With a backlog set aside: a usage page meanwhile, then the catch-up, on its real path
    (``background``: the scheduler's worker takes the task the roll-up sent, a slice at a time,
    while the usage pages and API are timed every moment) or ``manage.py catch_up_usage`` in a
    process of its own (its time and peak memory); then the roll-ups checked against the log."""
    import resource

    from django.db.models import Sum

    from gateway.models import RequestHour, RequestLog
    from gateway.usage.rollups import catching_up
    from slotserve_site.running.parts import scheduler_command

    if catching_up() is None:
        return
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        answer = page.get("/usage/?by=user&period=week")
        timings.append((time.perf_counter() - started) * 1000)
    says = "Usage is being brought up to date" in answer.content.decode()
    print(f"usage page with the backlog waiting: {statistics.median(timings):.0f} ms, says so: {says}")
    rows = RequestLog.objects.count()
    started = time.monotonic()
    if how == "background":
        worker = subprocess.Popen(
            scheduler_command(),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        during: dict[str, list[float]] = {path: [] for path in CATCH_UP_PAGES}
        try:
            while catching_up() is not None:
                for path in CATCH_UP_PAGES:
                    began = time.perf_counter()
                    page.get(path)
                    during[path].append((time.perf_counter() - began) * 1000)
                time.sleep(0.5)
                if time.monotonic() - started > 1800:
                    sys.exit("portal_load: the background catch-up did not end in 30 minutes")
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
        seconds = time.monotonic() - started
        said = f"by the scheduler's worker, in the background: {rows:,} rows in {seconds:.0f} s"
        for path, values in during.items():
            print(
                f"   {path} while it ran: p50 {statistics.median(values):.0f} ms, "
                f"p95 {percentile(values, 0.95):.0f} ms, max {max(values):.0f} ms ({len(values)} calls)"
            )
    else:
        done = subprocess.run(
            [sys.executable, "manage.py", "catch_up_usage"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        seconds = time.monotonic() - started
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        said = (
            f"by manage.py catch_up_usage: {rows:,} rows in {seconds:.0f} s, peak memory {peak:.0f} MB; "
            f"{done.stdout.strip().splitlines()[-1]}"
        )
    counted = RequestHour.objects.aggregate(n=Sum("requests"))["n"] or 0
    print(
        f"backlog caught up {said} ({rows / seconds:,.0f} rows/s); roll-ups count {counted:,} requests "
        f"({'all' if counted == rows else 'NOT all'})",
        flush=True,
    )


# The pages and call that read the roll-ups, timed while a backlog is caught up.
CATCH_UP_PAGES = (
    "/usage/?by=user&period=week",
    "/usage/?by=channel&period=week",
    "/api/usage/?by=channel&period=week",
)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="small,medium")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--users", default="20,50")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--log-order",
        choices=("random", "time"),
        default="random",
        help="the request log written in no time order (a restore, an import), or as the gateway writes it",
    )
    parser.add_argument(
        "--think", default="2,5", help="seconds a browsing colleague waits between pages: MIN,MAX (0,0: none)"
    )
    parser.add_argument(
        "--web-processes", type=int, default=0, help="SLOTSERVE_WEB_PROCESSES for the server (0: its default)"
    )
    parser.add_argument(
        "--burst", default="", help="after the colleagues: N people open the calendar at once (N,M: each)"
    )
    parser.add_argument(
        "--catch-up",
        choices=("background", "command"),
        default="background",
        help="catch the backlog up as a lab does (the scheduler's worker, pages timed) or by command",
    )
    parser.add_argument(
        "--reuse", action="store_true", help="keep the database the last run filled at that size"
    )
    options = parser.parse_args()
    base_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    db = urlsplit(base_url)
    if not db.scheme.startswith("postgres"):
        sys.exit("portal_load: DATABASE_URL must name a PostgreSQL server")
    database_url = f"{db.scheme}://{db.netloc}/{DATABASE}"
    work = Path(tempfile.mkdtemp(prefix="slotserve-portal-bench-"))
    os.environ.update(
        DJANGO_SETTINGS_MODULE="slotserve_site.settings",
        DATABASE_URL=database_url,
        SLOTSERVE_DATA_DIR=str(work / "data"),
        SLOTSERVE_SECRET_KEY=secrets.token_urlsafe(40),
        SLOTSERVE_REDIS_PREFIX=f"bench{secrets.token_hex(2)}",
        SLOTSERVE_LOG_LEVEL="WARNING",
        SLOTSERVE_ALLOWED_HOSTS="127.0.0.1,localhost,testserver",  # testserver: the query counts
    )
    import django

    django.setup()
    for name in options.sizes.split(","):
        run_size(name, SIZES[name], options, base_url, work)


def web_cpu_seconds(server_pid: int) -> float:
    """The CPU time the web processes (``run``'s slotserve_site.running.web) have used so far: a
    page's server CPU is the difference across its requests, divided by them (the scheduler and
    the other parts are processes of their own, not counted)."""
    import psutil

    web: list[psutil.Process] = []
    for process in psutil.Process(server_pid).children(recursive=True):
        try:
            if "slotserve_site.running.web" in " ".join(process.cmdline()):
                web.append(process)
        except psutil.Error:
            continue
    spent = 0.0
    for process in web:
        try:
            times = process.cpu_times()
            spent += times.user + times.system
        except psutil.Error:
            continue
    return spent


def filled(size: dict[str, int], options: argparse.Namespace) -> Any:
    """With ``--reuse``: the staff member of a database the last run filled at this size, or None."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import DatabaseError

    from gateway.models import RequestLog

    try:
        started = time.monotonic()
        call_command("migrate", verbosity=0)  # what changed since that run, as an upgrade does
        print(f"   migrated the kept database in {time.monotonic() - started:.1f} s", flush=True)
        if RequestLog.objects.count() != size["log"]:
            return None
        return get_user_model().objects.get(username="bench-staff")
    except (DatabaseError, LookupError, ObjectDoesNotExist):
        return None


def run_size(name: str, size: dict[str, int], options: argparse.Namespace, base_url: str, work: Path) -> None:
    import httpx
    import psycopg
    from django.core.management import call_command
    from django.db import connection, connections
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    connections.close_all()
    if hasattr(connection, "close_pool"):  # pooled connections stay open until the pool closes
        connection.close_pool()
    started = time.monotonic()
    staff = filled(size, options) if options.reuse else None
    if staff is None:
        with psycopg.connect(base_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {DATABASE}")
        call_command("migrate", verbosity=0)
        staff = fill(size, options.seed, options.log_order)["staff"]
    with connection.cursor() as cursor:  # as autovacuum would have: plans from real statistics
        cursor.execute("ANALYZE")
    print(f"\n== {name}: {size} (filled in {time.monotonic() - started:.0f} s)", flush=True)
    page = Client()
    page.force_login(staff)
    catch_up_backlog(page, options.catch_up)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    cookie = page.cookies["sessionid"].value

    # Queries per page, in this process on the same database (a first visit first).
    queries: dict[str, int] = {}
    for path in PAGES:
        page.get(path)
        with CaptureQueriesContext(connection) as captured:
            answer = page.get(path)
            if hasattr(answer, "streaming_content"):
                b"".join(answer.streaming_content)
        queries[path] = len(captured)
    from channels_app.scheduling.tasks import scheduler_tick

    with CaptureQueriesContext(connection) as captured:
        tick_started = time.perf_counter()
        scheduler_tick()
        tick_ms = (time.perf_counter() - tick_started) * 1000
    print(f"scheduler tick: {tick_ms:.0f} ms, {len(captured)} queries")
    connections.close_all()

    port = free_port()
    log = (work / f"run-{name}.log").open("w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if options.web_processes:
        env["SLOTSERVE_WEB_PROCESSES"] = str(options.web_processes)
    server = subprocess.Popen(
        [sys.executable, "manage.py", "run", "--no-node", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        client = httpx.Client(base_url=base, cookies={"sessionid": cookie}, timeout=120)
        print(f"{'page or call':40} {'p50':>9} {'p95':>9} {'queries':>8} {'bytes':>9} {'server CPU':>11}")
        for path in PAGES:
            times, length = [], 0
            cpu_before = web_cpu_seconds(server.pid)
            for _ in range(options.requests):
                begun = time.perf_counter()
                got = client.get(path)
                times.append((time.perf_counter() - begun) * 1000)
                length = len(got.content)
                if got.status_code != 200:
                    print(f"  {path}: {got.status_code}")
            cpu_ms = (web_cpu_seconds(server.pid) - cpu_before) / options.requests * 1000
            print(
                f"{path:40} {statistics.median(times):7.0f}ms {percentile(times, 0.95):7.0f}ms "
                f"{queries[path]:8d} {length:9d} {cpu_ms:9.0f}ms"
            )
        begun = time.perf_counter()
        rows = 0
        with client.stream("GET", "/api/requests/csv") as export:
            first_byte = None
            for chunk in export.iter_bytes():
                first_byte = first_byte or time.perf_counter() - begun
                rows += chunk.count(b"\n")
        spent = time.perf_counter() - begun
        print(
            f"CSV export: {rows - 1} rows in {spent:.1f} s ({(rows - 1) / spent:,.0f} rows/s), "
            f"first byte {first_byte or 0:.2f} s"
        )
        low, high = (float(t) for t in options.think.split(","))
        think = (low, high)
        for users in (int(u) for u in options.users.split(",")):
            concurrent(base, cookie, users, options.seconds, base_url, think)
        for people in (int(n) for n in options.burst.split(",") if n):
            burst(base, cookie, people)
        rss = _rss_mb(server.pid)
        print(f"web and scheduler processes' resident memory: {rss}")
    finally:
        os.killpg(server.pid, signal.SIGINT)
        server.wait(timeout=60)


def concurrent(
    base: str, cookie: str, users: int, seconds: float, base_url: str, think: tuple[float, float]
) -> None:
    import httpx
    import psycopg

    statuses: Counter[int] = Counter()
    times: list[float] = []
    stop = time.monotonic() + seconds
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        with psycopg.connect(base_url, autocommit=True) as admin:
            while not done.is_set():
                row = admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [DATABASE]
                ).fetchone()
                peak[0] = max(peak[0], int(row[0]) if row else 0)
                time.sleep(0.1)

    def colleague(n: int) -> None:
        pace = random.Random(n)
        with httpx.Client(base_url=base, cookies={"sessionid": cookie}, timeout=60) as client:
            i = n
            # Colleagues are at different points of their reading when the measurement begins:
            # not fifty first clicks in the same instant.
            time.sleep(pace.uniform(0, think[1]))
            while time.monotonic() < stop:
                path = PAGES[i % len(PAGES)]
                i += 1
                begun = time.perf_counter()
                try:
                    statuses[client.get(path).status_code] += 1
                except httpx.HTTPError:
                    statuses[0] += 1
                times.append((time.perf_counter() - begun) * 1000)
                if think[1] > 0:  # a person reads the page before the next click
                    time.sleep(pace.uniform(*think))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    threads = [threading.Thread(target=colleague, args=(n,)) for n in range(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    watcher.join()
    spent = time.monotonic() - started
    errors = sum(n for code, n in statuses.items() if code != 200)
    print(
        f"{users} users at once ({think[0]:g}-{think[1]:g} s between pages): "
        f"{len(times) / spent:.1f} requests/s, p50 {statistics.median(times):.0f} ms, "
        f"p95 {percentile(times, 0.95):.0f} ms, errors {errors} of {len(times)} {dict(statuses)}, "
        f"PostgreSQL connections at the peak {peak[0]}"
    )


def burst(base: str, cookie: str, people: int) -> None:
    """``people`` open the calendar in the same second, each on a connection of their own (the
    whole lab at nine): how long until the last one has it, and each one's wait."""
    import asyncio

    import httpx

    async def everyone() -> tuple[list[float], Counter[int], float]:
        statuses: Counter[int] = Counter()
        times: list[float] = []
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)

        async def person(n: int) -> None:
            async with httpx.AsyncClient(
                base_url=base, cookies={"sessionid": cookie}, timeout=300, limits=limits
            ) as client:
                await asyncio.sleep(n / people)  # all within one second
                begun = time.perf_counter()
                try:
                    statuses[(await client.get("/calendar/")).status_code] += 1
                except httpx.HTTPError:
                    statuses[0] += 1
                times.append(time.perf_counter() - begun)

        started = time.perf_counter()
        await asyncio.gather(*(person(n) for n in range(people)))
        return times, statuses, time.perf_counter() - started

    times, statuses, spent = asyncio.run(everyone())
    errors = sum(n for code, n in statuses.items() if code != 200)
    print(
        f"{people} people open the calendar within a second: the last had it after {spent:.1f} s, "
        f"each waited p50 {statistics.median(times):.1f} s, p95 {percentile(times, 0.95):.1f} s; "
        f"{len(times) / spent:.1f} pages/s; errors {errors} of {people} {dict(statuses)}"
    )


def _rss_mb(parent: int) -> str:
    sizes = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[1]) != parent:
                continue
            rss = int((entry / "statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20
            sizes.append(f"{' '.join((entry / 'cmdline').read_text().split(chr(0))[2:4])} {rss} MB")
        except (OSError, IndexError, ValueError):
            continue
    return "; ".join(sizes)


if __name__ == "__main__":
    main()
