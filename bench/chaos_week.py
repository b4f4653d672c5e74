#!/usr/bin/env python
"""A lab's week under faults: everything runs and breaks at once, every promise checked.

    sudo .venv/bin/python bench/chaos_week.py [--seed 1] [--days 7] [--hour-seconds 4]
        [--bookings 300] [--users 10] [--json results.json] [--short] [--stop-on-miss]

Needs root (network namespaces) and PostgreSQL's server programs (Debian's ``postgresql``: a
cluster of the benchmark's own is made with ``initdb``, so that restarting it harms nobody).
The cluster is ``bench/cluster_bench.py``'s: the control host runs ``manage.py run --no-node``
(tick 1 s) on a bridge; two GPU nodes, each in its own network namespace with four fake GPUs,
run ``manage.py nodeworker``, started again by the benchmark when they die, as systemd's
``Restart=always`` would; every model is the stand-in server with a load time of 1-5 s.

**The lab.** A compressed week (an hour lasts ``--hour-seconds``): ``--bookings`` bookings by
``--users`` people across 8 channels (two of them need a staff approval), made, approved,
cancelled and ended early through the REST API with each person's API key, some keys scoped to
models; all the while everyone calls the gateway: streams and short requests, some hung up
after the first chunk, on their own bookings and on the default model. Each node's first channel
lends booked time while the booker is idle, and half the bookings there lend: between their own
requests, others call a lent slot's model now and then (docs/gateway.md, "Lending"). One request
in twenty outside a slot names a model no channel runs by default and nobody books: it is loaded
on demand where a channel is free for it, and released when idle (docs/scheduling.md, "Loaded
on demand"), while promise 5 holds for every covered booking all the same.

**The faults**, at moments drawn from the seed, one after the other (each kind at least once):
``kill -9`` of a node worker, of an inference process, of the scheduler's Celery worker and beat,
of the web process; a Redis restart; a PostgreSQL restart; a node's link cut for shorter and
for longer than the not-ready threshold (3 ticks); a webhook receiver that stalls for 12 s; a
node's disk filled (its run-log folder is a tmpfs of 64 MiB) for 10 s. Each one's recovery is
timed: until the part is back, every channel runs what it should and ``/health`` answers 200.

**The webhooks.** Staff's two webhooks of every event, to a quick receiver and a slow one (past
the 2 s deadline on one try in ten), and one person's of their own bookings, to a receiver that
answers 500 to one try in four (``bench/chaos_receivers.py``), made through the REST API.

**The promises**, checked from the callers' answers, the database and ``ps`` (docs/faults.md
says which promise holds under which fault, and the checker expects exactly that):

1. during an approved slot nobody but the booker gets an answer from that channel, but for
   borrowed answers of its own model in a slot that lends; the booker's requests there never
   wait their turn;
2. no answer is a 500, every refusal is a documented code, with ``Retry-After`` where
   docs/api.md promises one;
3. every answer a caller received is in the request log (records still in Redis when it
   restarts are lost: exactly those, read just before), none twice;
4. every event reaches each webhook that hears of it, at least once, under one ``webhook-id``,
   in order per object;
5. every booking whose gap (from its approval and from the slot before it) was at least its
   model's load time, as SlotServe measured it, + 1 s, and whose node stayed up from its
   preload to its start, is ready at its start;
6. within 3 ticks (and a load) of the last fault: each channel runs its decision, no request is
   counted in flight once the callers stop, no inference process runs that no channel owns,
   every node is ready;
7. no booking or webhook the API confirmed is lost.

Promises 1, 2 and 5 are also judged while the week runs: each answer as it comes, each booking
two seconds after its start, each slot once its end is three ticks past (its requests logged); a
broken one is printed at once with its story, and with
``--stop-on-miss`` the run ends there (the faults stop, and what ran is checked as at the end).
It prints a table per fault kind
and per promise, and the violations; ``--json`` writes the same. The exit status is 1 when a
promise was broken. ``--short`` is the suite's run (``tests/test_chaos_week.py``): one
compressed day, each fault once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chaos_receivers import WEBHOOK_ENV, LabReceiver, check_webhooks, drained  # noqa: E402

SUBNET = "10.231.79"  # or the next free one (devtools/cluster.py)
NODES = {"chaos-a": 31, "chaos-b": 32}
GPUS_PER_NODE = 4
LOAD_SECONDS = [1, 2, 3, 4, 5]
WEB_PORT, REDIS_PORT, PG_PORT = 18090, 16390, 15490
TICK = 1.0
FAULT_KINDS = (
    "kill node worker",
    "kill inference process",
    "kill scheduler",
    "kill web",
    "restart redis",
    "restart postgresql",
    "cut link briefly",
    "cut link long",
    "slow webhook receiver",
    "fill a node's disk",
)
# Each node's run-log folder is a tmpfs of this size (a real server logs every request).
RUN_LOG_DISK = "64m"
# Each node's first channel lends booked time while the booker is idle (docs/gateway.md).
LENDING_INDEX = 0
# The channel whose default is a real llama-server (a tiny model written at the start).
REAL_CHANNEL, REAL_MODEL = "chaos-b-2", "tiny"
ON_DEMAND_MODEL = "on-demand"
# Codes whose answers carry Retry-After (docs/api.md, "Gateway errors").
WITH_RETRY_AFTER = {
    "model_loading",
    "model_switching",
    "gpu_exclusive",
    "rate_limit_exceeded",
    "insufficient_quota",
    "queue_full",
    "channel_queue_full",
    "service_unavailable",
    "preempted_by_booker",
}


@dataclass
class Violation:
    promise: int
    at: float  # seconds since the lab began
    what: str
    kind: str = ""  # for promise 3: "missing" (answers not logged) or "twice"


@dataclass
class Fault:
    kind: str
    at: float
    target: str = ""
    pid: int | None = None
    lost_records: int = 0  # request records waiting in Redis when it was killed
    recovered_after: float | None = None  # seconds, None: not within the wait


@dataclass
class Answer:
    at: float  # wall clock (time.time()) when the request was sent
    user: str
    model: str
    status: int
    code: str = ""
    retry_after: bool = False
    hung_up: bool = False
    error: str = ""


@dataclass
class Lab:
    """What the run saw: the callers' answers, the bookings the API confirmed, the faults."""

    began: float = field(default_factory=time.time)
    answers: list[Answer] = field(default_factory=list)
    confirmed: dict[int, str] = field(default_factory=dict)  # reservation id → the status we left it in
    booked_again: int = 0  # bookings made once the control host answered again
    refused: dict[str, int] = field(default_factory=dict)  # why a planned booking was not made → how many
    faults: list[Fault] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    checks: dict[int, int] = field(default_factory=dict)  # promise → checks made
    lock: threading.Lock = field(default_factory=threading.Lock)
    samples: list[tuple[float, dict[int, int | None]]] = field(default_factory=list)  # ready presets
    node_down: dict[str, list[list[float]]] = field(default_factory=dict)  # node → spells [from, to]
    # reservation id → what the lab's calls made of it ("approved", "cancelled", "ended early")
    made: dict[int, set[str]] = field(default_factory=dict)
    webhooks: dict[int, LabReceiver] = field(default_factory=dict)  # the API confirmed them
    decided: dict[int, float] = field(default_factory=dict)  # reservation → first its channel's target
    # Covered bookings: seconds from approval to decision, and from decision to their load's start.
    handover: dict[str, list[float]] = field(default_factory=lambda: {"to decision": [], "to load": []})
    # reservation id → how and when (seconds into the run) the API last confirmed it
    told: dict[int, str] = field(default_factory=dict)

    def violated(self, promise: int, at: float, what: str, kind: str = "") -> None:
        with self.lock:
            self.violations.append(Violation(promise, round(at - self.began, 2), what, kind))

    def checked(self, promise: int, count: int = 1) -> None:
        with self.lock:
            self.checks[promise] = self.checks.get(promise, 0) + count

    def not_made(self, why: str) -> None:
        """Count a planned booking that was not made, by why."""
        with self.lock:
            self.refused[why] = self.refused.get(why, 0) + 1


# --- The machines ----------------------------------------------------------------


class PrivatePostgres:
    """A PostgreSQL cluster of the benchmark's own, run as the ``postgres`` user."""

    def __init__(self, folder: Path, listen: str) -> None:
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
        if not bins:
            raise SystemExit("chaos_week: PostgreSQL's server programs are not installed (postgresql)")
        self.bin, self.folder, self.listen = bins[-1], folder, listen
        self.data = folder / "pg"

    def _as_postgres(self, *argv: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *argv], check=True, capture_output=True, timeout=120
        )

    def create(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        shutil.chown(self.folder, "postgres")
        self._as_postgres(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '{self.listen}'\nport = {PG_PORT}\n"
                f"unix_socket_directories = '{self.folder}'\n"
                # A commit is written to the kernel before it is acknowledged (synchronous_commit
                # on, as in production), so a restart of the server loses nothing it confirmed;
                # fsync only matters when the machine itself crashes, which the lab does not do.
                "fsync = off\nfull_page_writes = off\nmax_connections = 200\n"
            )
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.listen.rsplit('.', 1)[0]}.0/24 trust\n")
        self.start()

    def start(self) -> None:
        self._as_postgres(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-l", str(self.folder / "pg.log"), "start"
        )

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")


class Machines:
    """The control host, the nodes, Redis and PostgreSQL, and the hands that break them."""

    def __init__(self, work: Path, tag: str) -> None:
        from devtools.cluster import Cluster

        self.work, self.tag = work, tag
        self.net = Cluster(tag, SUBNET)
        self.pg = PrivatePostgres(work / "postgres", self.net.control)
        self.redis_password = secrets.token_urlsafe(12)
        self.redis: subprocess.Popen[bytes] | None = None
        self.control: subprocess.Popen[bytes] | None = None
        self.nodes: dict[str, subprocess.Popen[bytes] | None] = {}
        self.env: dict[str, str] = {}
        self.stopping = False
        self.llama_server = ""

    @property
    def base(self) -> str:
        return f"http://{self.net.control}:{WEB_PORT}"

    def up(self) -> None:
        from devtools.cluster import redis_answers

        built = subprocess.run(
            [str(ROOT / "scripts" / "build-llama-server")], capture_output=True, text=True, timeout=3600
        )
        if built.returncode != 0:
            raise SystemExit(f"chaos_week: could not build llama-server:\n{built.stderr[-2000:]}")
        self.llama_server = built.stdout.strip().splitlines()[-1]
        self.net.up()
        self.pg.create()
        self.start_redis()
        redis_url = f"redis://:{self.redis_password}@{self.net.control}:{REDIS_PORT}/0"
        for _ in range(50):
            if redis_answers(redis_url):
                break
            time.sleep(0.1)
        self.env = {
            "PATH": os.environ.get("PATH", ""),
            "PYTHONUNBUFFERED": "1",
            "DJANGO_SETTINGS_MODULE": "slotserve_site.settings",
            "DATABASE_URL": f"postgres://postgres@{self.net.control}:{PG_PORT}/postgres",
            "SLOTSERVE_REDIS_URL": redis_url,
            "SLOTSERVE_REDIS_PREFIX": f"chaos{self.tag}",
            "SLOTSERVE_SECRET_KEY": secrets.token_urlsafe(32),
            "SLOTSERVE_TICK_SECONDS": str(int(TICK)),
            "SLOTSERVE_MIN_PRELOAD_SECONDS": "0",  # a compressed week: the real 180 s is hours
            # Loads on demand, compressed too: a channel free for its load and 5 s more loads a
            # model nobody runs, released after 4 s without a request.
            "SLOTSERVE_ON_DEMAND_MIN_STAY_SECONDS": "5",
            "SLOTSERVE_ON_DEMAND_IDLE_SECONDS": "4",
            "SLOTSERVE_ON_DEMAND_LOADS_PER_HOUR": "1000",
            "SLOTSERVE_LOG_LEVEL": "WARNING",
            "SLOTSERVE_ALLOWED_HOSTS": self.net.control,
            **WEBHOOK_ENV,
        }
        os.environ.update(self.env)
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        home = self.work / "control"
        home.mkdir()
        self.control = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "run",
                "--no-node",
                "--host",
                self.net.control,
                "--port",
                str(WEB_PORT),
            ],
            cwd=ROOT,
            env={**self.env, "HOME": str(home), "SLOTSERVE_DATA_DIR": str(home / "data")},
            stdout=(home / "run.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        (self.work / "models").mkdir()
        for name, host in NODES.items():
            self.net.add_node(name, host)
            runs = self.work / name / "data" / "runs"
            runs.mkdir(parents=True)
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={RUN_LOG_DISK},mode=0700", "tmpfs", str(runs)],
                check=True,
            )
            self.start_node(name)

    def start_redis(self) -> None:
        from devtools.cluster import redis_executable

        self.redis = subprocess.Popen(
            [
                redis_executable(),
                *("--bind", self.net.control, "--port", str(REDIS_PORT), "--save", "", "--appendonly", "no"),
                *("--requirepass", self.redis_password, "--dir", str(self.work)),
            ],
            stdout=subprocess.DEVNULL,
        )

    def start_node(self, name: str) -> None:
        from devtools.cluster import node_worker_env, start_node_worker

        home = self.work / name
        address = f"{self.net.subnet}.{NODES[name]}"
        env = node_worker_env(self.env, home, name, address, GPUS_PER_NODE, self.work / "models")
        env["SLOTSERVE_VLLM"] = env["SLOTSERVE_LLAMA_SERVER"]  # the stand-ins play vLLM
        if REAL_CHANNEL.startswith(name + "-"):
            env["SLOTSERVE_LLAMA_SERVER"] = self.llama_server
        self.nodes[name] = start_node_worker(self.net.nodes[name], name, env, home / "node-worker.log", ROOT)

    def keep_nodes_running(self) -> None:
        """As systemd's ``Restart=always``: a node worker that died is started again in 1 s."""
        while not self.stopping:
            for name, process in self.nodes.items():
                if process is not None and process.poll() is not None and not self.stopping:
                    time.sleep(1)
                    self.start_node(name)
            time.sleep(0.2)

    def part(self, flag: bytes) -> int | None:
        """The pid of the control host's part whose command line has ``flag``."""
        assert self.control is not None
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if int(stat[1]) == self.control.pid and stat[0] != "Z" and any(flag in arg for arg in cmdline):
                return int(entry.name)
        return None

    def down(self) -> None:
        self.stopping = True
        from devtools.cluster import stop_inference_processes

        stop_inference_processes()
        for pid in _standins(self.work):  # what the database did not know of, or could not say
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for process in [*self.nodes.values(), self.control]:
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGINT)
        for process in [*self.nodes.values(), self.control]:
            if process is not None:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
        if self.redis is not None:
            self.redis.kill()
        self.pg.stop()
        for name in NODES:
            subprocess.run(["umount", "-l", str(self.work / name / "data" / "runs")], capture_output=True)
        self.net.down()


# --- The lab ---------------------------------------------------------------------


@dataclass
class Planned:
    user: str
    channel: str
    start: datetime
    end: datetime
    load: int
    create_at: datetime  # when its booker books it
    then: str = ""  # "cancel" before it starts, "end" halfway, or nothing
    reservation_id: int = 0
    status: str = ""
    approved_at: float = 0.0  # when the API said it was approved (time.time())
    portal: bool = False  # booked through the portal's form, not the REST API
    lend: bool = False  # its booker lends it while idle (on a channel that lends)


def plan_week(
    channels: list[str], users: list[str], args: argparse.Namespace, rng: random.Random, begin: datetime
) -> list[Planned]:
    """``args.bookings`` slots over the compressed week, each channel's one after another with
    gaps of 0-3 hours, booked 1-24 hours ahead by a random person."""
    hour = args.hour_seconds
    plan: list[Planned] = []
    free_at = dict.fromkeys(channels, begin + timedelta(seconds=round(2 * hour)))
    week_end = begin + timedelta(seconds=args.days * 24 * hour)
    for number in range(args.bookings):
        name = channels[number % len(channels)]
        # Whole seconds, as the portal's form books them (a compressed half hour may not be).
        start = free_at[name] + timedelta(seconds=round(rng.choice([0, 0, 0.5, 1, 2, 3]) * hour))
        end = start + timedelta(seconds=round(rng.choice([1, 1.5, 2, 3, 4]) * hour))
        if end > week_end:
            continue
        ahead = timedelta(seconds=rng.choice([1, 2, 6, 24]) * hour)
        then = rng.choices(["", "cancel", "end"], weights=[8, 1, 1])[0]
        plan.append(
            Planned(
                rng.choice(users),
                name,
                start,
                end,
                rng.choice(LOAD_SECONDS),
                max(begin, start - ahead),
                then,
                portal=rng.random() < 0.25,
                lend=name.endswith(f"-{LENDING_INDEX}") and rng.random() < 0.5,
            )
        )
        free_at[name] = end
    return sorted(plan, key=lambda p: p.create_at)


# How long the node workers have to register at the start.
REGISTER_SECONDS = 180


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) or "(nothing)"
    except OSError as exc:
        return f"(no log: {exc})"


class World:
    """The lab's people, keys, models and channels, made in the database."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        from django.contrib.auth import get_user_model

        from channels_app.models import Channel, LLMModel, Node, Preset
        from gateway.api_keys import api_key_create

        # Three Python programs and a database starting on a machine the suite also loads: the
        # wait is generous, and a node that did not come says what its worker wrote.
        deadline = time.monotonic() + REGISTER_SECONDS
        while True:
            registered = set(
                Node.objects.filter(name__in=NODES, gpus__isnull=False).values_list("name", flat=True)
            )
            if len(registered) == len(NODES):
                break
            if time.monotonic() > deadline:
                missing = sorted(set(NODES) - registered)
                logs = "\n".join(
                    f"{name}'s worker wrote:\n{_tail(work / name / 'node-worker.log')}" for name in missing
                )
                raise SystemExit(
                    f"chaos_week: {', '.join(missing)} did not register within {REGISTER_SECONDS} s\n{logs}"
                )
            time.sleep(0.3)
        self.presets: dict[int, Any] = {}
        for load in LOAD_SECONDS:
            path = work / "models" / f"load-{load}s.gguf"
            path.write_bytes(b"GGUF")
            model = LLMModel.objects.create(
                name=f"load-{load}s", backend="vllm", path=str(path), size_bytes=4
            )
            self.presets[load] = Preset.objects.create(
                model=model, name="lab", args=f"--standin-load-seconds {load}"
            )
        default = self.presets[1]
        # A model no channel runs by default and nobody books: loaded on demand where a channel is
        # free for it (docs/scheduling.md, "Loaded on demand"), the stand-in's own 2 s load.
        on_demand = work / "models" / "on-demand.gguf"
        on_demand.write_bytes(b"GGUF")
        LLMModel.objects.create(name=ON_DEMAND_MODEL, backend="vllm", path=str(on_demand), size_bytes=4)
        # One channel's default is a real llama-server with a tiny model (REAL_CHANNEL).
        from devtools.tinymodel import write_tiny_llama

        tiny_path = write_tiny_llama(work / "models" / "tiny.gguf")
        tiny = LLMModel.objects.create(
            name=REAL_MODEL, backend="llama.cpp", path=str(tiny_path), size_bytes=tiny_path.stat().st_size
        )
        self.real = Preset.objects.create(model=tiny, name="lab", args="-c 256 -t 1")
        self.channels: dict[str, Any] = {}
        for node in Node.objects.filter(name__in=NODES).order_by("name"):
            for index in range(GPUS_PER_NODE):
                name = f"{node.name}-{index}"
                own = self.real if name == REAL_CHANNEL else default
                self.channels[name] = Channel.objects.create(
                    name=name,
                    node=node,
                    gpu_indexes=[index],
                    default_model=own.model,
                    default_preset=own,
                    min_booking_minutes=0,
                    approval_policy="all" if index == GPUS_PER_NODE - 1 else "none",
                    lend_while_idle=index == LENDING_INDEX,
                )
        users = get_user_model()
        chief = users.objects.create_user("chief", is_staff=True, password=secrets.token_urlsafe(12))
        self.staff_key = api_key_create(user=chief, name="chaos")[1]
        self.keys: dict[str, str] = {}
        self.passwords: dict[str, str] = {}
        for number in range(args.users):
            name = f"u{number:02d}"
            self.passwords[name] = secrets.token_urlsafe(12)
            person = users.objects.create_user(name, password=self.passwords[name])
            # Every third person's key is scoped to the models they use.
            scoped = [p.model for p in self.presets.values()] if number % 3 == 0 else None
            self.keys[person.username] = api_key_create(user=person, name="chaos", models=scoped)[1]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def make_webhooks(lab: Lab, world: World, base: str, seed: int) -> None:
    """Staff's webhooks of every event to the fast and the slow receiver, and one person's of
    their own bookings to the flaky one, made through the REST API."""
    for kind, owner_key, scope in (
        ("fast", world.staff_key, "all"),
        ("slow", world.staff_key, "all"),
        ("flaky", world.keys["u00"], "mine"),
    ):
        receiver = LabReceiver(kind, seed)
        answer = httpx.post(
            base + "/api/webhooks/",
            json={"url": receiver.url, "name": kind, "scope": scope},
            headers={"Authorization": f"Bearer {owner_key}"},
            timeout=20,
        )
        if answer.status_code != 201:
            raise SystemExit(
                f"chaos_week: the {kind} webhook was refused: {answer.status_code} {answer.text}"[:500]
            )
        lab.webhooks[answer.json()["id"]] = receiver


def events_expected(lab: Lab, stopped: float) -> dict[int, set[str]]:
    """booking id → the events the lab's own calls and the clock made of it (a slot that began
    or ended at least 3 ticks before the callers stopped)."""
    from reservations.models import Reservation

    expected: dict[int, set[str]] = {}
    margin = stopped - 3 * TICK
    for reservation in Reservation.objects.filter(pk__in=list(lab.made)):
        made = lab.made[reservation.pk]
        events = {"booking.requested"}
        if "approved" in made:
            events.add("booking.approved")
        if "cancelled" in made:
            events.add("booking.cancelled")
        if "ended early" in made:
            events.add("booking.ended_early")
        if reservation.status in ("approved", "ended") and reservation.start.timestamp() <= margin:
            events.add("booking.started")
        if reservation.status == "approved" and reservation.end.timestamp() <= margin:
            events.add("booking.ended")
        expected[reservation.pk] = events
    return expected


class ControlHostAway(Exception):
    """The control host did not answer (a fault): the person tries again a second later."""


class Refused(Exception):
    """The control host refused the booking: its status and what it said (the summary counts
    them, with whether the booking was sent only after its start, the benchmark being late)."""


def book(lab: Lab, world: World, base: str, planned: list[Planned], stop: threading.Event) -> None:
    """The people book, staff approve, and some cancel or end early, as the plan says. A booking
    the control host did not answer is tried again each second until its start, as a person
    does: first looked for among their bookings (the answer may be what was lost), then sent."""
    from django.utils import timezone

    client = httpx.Client(base_url=base, timeout=20)
    portals: dict[str, httpx.Client] = {}  # each person's signed-in browser session
    pending: list[tuple[float, Planned]] = []
    follow_ups: list[tuple[datetime, Planned]] = []
    again: list[tuple[float, Planned]] = []  # bookings the control host did not answer
    queue = list(planned)
    while not stop.is_set() and (queue or pending or follow_ups or again):
        now = timezone.now()
        due_now = []
        while queue and queue[0].create_at <= now:
            due_now.append((queue.pop(0), False))
        for due, slot in list(again):
            if due <= time.time():
                again.remove((due, slot))
                if slot.start > now:
                    due_now.append((slot, True))
                else:  # the person gives up: the slot began while the control host was away
                    lab.not_made("given up at its start, the control host away")
        for slot, retried in due_now:
            try:
                made = (_its_booking(world, base, slot) if retried else None) or _send_booking(
                    client, portals, world, base, slot
                )
            except ControlHostAway:
                again.append((time.time() + 1, slot))
                continue
            except Refused as refused:
                late = " (sent after its start)" if slot.start <= timezone.now() else ""
                lab.not_made(f"{refused}{late}")
                continue
            if made is None:  # the portal took it and the REST API does not show it
                lab.not_made("taken by the portal, not shown by the REST API")
            else:
                slot.reservation_id, slot.status = made["id"], made["status"]
                if slot.status == "approved":
                    slot.approved_at = time.time()
                with lab.lock:
                    lab.booked_again += retried
                    lab.confirmed[slot.reservation_id] = slot.status
                    lab.made[slot.reservation_id] = {slot.status}
                    door = "the portal" if slot.portal else "the REST API"
                    at = time.time() - lab.began
                    lab.told[slot.reservation_id] = f"booked {slot.status} in {door} at {at:.2f} s"
                if slot.status == "pending":
                    pending.append((time.time() + 1.5, slot))
                if slot.then == "cancel":
                    follow_ups.append((slot.start - (slot.start - now) / 2, slot))
                elif slot.then == "end":
                    follow_ups.append((slot.start + (slot.end - slot.start) / 2, slot))
        for due, slot in list(pending):
            if due <= time.time():
                pending.remove((due, slot))
                answer = _call(
                    client, "POST", f"/api/reservations/{slot.reservation_id}/approve", world.staff_key
                )
                if answer is not None and answer.status_code == 200:
                    slot.status, slot.approved_at = "approved", time.time()
                    with lab.lock:
                        lab.confirmed[slot.reservation_id] = "approved"
                        lab.made[slot.reservation_id].add("approved")
                        lab.told[slot.reservation_id] += f", approved at {time.time() - lab.began:.2f} s"
                elif answer is None or answer.status_code >= 500:
                    pending.append((time.time() + 1, slot))  # the control host is down: again
        for due_at, slot in list(follow_ups):
            if due_at <= timezone.now():
                follow_ups.remove((due_at, slot))
                verb = "cancel" if slot.then == "cancel" else "end"
                answer = _call(
                    client, "POST", f"/api/reservations/{slot.reservation_id}/{verb}", world.keys[slot.user]
                )
                if answer is not None and answer.status_code == 200:
                    with lab.lock:
                        lab.confirmed[slot.reservation_id] = answer.json()["status"]
                        lab.made[slot.reservation_id].add("cancelled" if verb == "cancel" else "ended early")
                        lab.told[slot.reservation_id] += f", {verb} at {time.time() - lab.began:.2f} s"
        stop.wait(0.1)


def _send_booking(
    client: httpx.Client, portals: dict[str, httpx.Client], world: World, base: str, slot: Planned
) -> dict[str, Any] | None:
    """Book ``slot`` through its door: the booking as the REST API shows it (None if the portal
    took it and the API does not show it); Refused, or ControlHostAway if the control host did
    not answer."""
    if slot.portal:
        return book_in_portal(portals, world, base, slot)
    preset = world.presets[slot.load]
    body = {
        "channel": world.channels[slot.channel].pk,
        "start": slot.start.isoformat(),
        "end": slot.end.isoformat(),
        "model": preset.model_id,
        "preset": preset.pk,
        "lend": slot.lend,
    }
    answer = _call(client, "POST", "/api/reservations/", world.keys[slot.user], body)
    if answer is None or answer.status_code >= 500:
        raise ControlHostAway
    if answer.status_code != 201:
        raise Refused(f"REST API {answer.status_code}: {_first_error(answer)}")
    made: dict[str, Any] = answer.json()
    return made


def _first_error(answer: httpx.Response) -> str:
    """The error's code, or the first field an answer of 400 names."""
    try:
        found = answer.json()
    except ValueError:
        return answer.text[:80]
    error = found.get("error") if isinstance(found, dict) else None
    if isinstance(error, dict) and error.get("code"):
        return str(error["code"])
    return next(iter(found), "?") if isinstance(found, dict) else str(found)[:80]


def book_in_portal(
    portals: dict[str, httpx.Client], world: World, base: str, slot: Planned
) -> dict[str, Any] | None:
    """Book ``slot`` as a person does in the portal: sign in (once), open the booking page, send
    its form in the installation's time zone; then read the booking back through the REST API.
    Refused when the portal refused it; ControlHostAway when the control host did not answer."""
    from zoneinfo import ZoneInfo

    from django.conf import settings

    zone = ZoneInfo(settings.TIME_ZONE)
    browser = portals.get(slot.user)
    try:
        if browser is None:
            browser = httpx.Client(base_url=base, timeout=20)
            browser.get("/accounts/login/").raise_for_status()
            signed_in = browser.post(
                "/accounts/login/",
                data={
                    "username": slot.user,
                    "password": world.passwords[slot.user],
                    "csrfmiddlewaretoken": browser.cookies.get("csrftoken", ""),
                },
            )
            if signed_in.status_code >= 500:
                raise ControlHostAway
            if signed_in.status_code != 302:
                raise Refused(f"portal sign-in {signed_in.status_code}")
            portals[slot.user] = browser
        browser.get("/book/").raise_for_status()
        preset = world.presets[slot.load]
        sent = browser.post(
            "/book/",
            data={
                "channel": world.channels[slot.channel].pk,
                "start": slot.start.astimezone(zone).strftime("%Y-%m-%dT%H:%M:%S"),
                "end": slot.end.astimezone(zone).strftime("%Y-%m-%dT%H:%M:%S"),
                "model": preset.model_id,
                "preset": preset.pk,
                **({"lend": "on"} if slot.lend else {}),
                "csrfmiddlewaretoken": browser.cookies.get("csrftoken", ""),
            },
        )
    except httpx.HTTPError:
        portals.pop(slot.user, None)  # signed in again next time
        raise ControlHostAway from None
    if sent.status_code >= 500:
        raise ControlHostAway
    if sent.status_code != 302:
        raise Refused(f"portal form {sent.status_code}")
    return _its_booking(world, base, slot)


def _its_booking(world: World, base: str, slot: Planned) -> dict[str, Any] | None:
    """``slot``'s booking among the person's bookings on its channel, as the REST API shows it."""
    try:
        mine = httpx.get(
            base + "/api/reservations/",
            params={"channel": world.channels[slot.channel].pk, "limit": 500},
            headers={"Authorization": f"Bearer {world.keys[slot.user]}"},
            timeout=20,
        )
        mine.raise_for_status()
        found = mine.json()
    except (httpx.HTTPError, ValueError):
        raise ControlHostAway from None
    rows = found["results"] if isinstance(found, dict) else found
    starts = slot.start.isoformat().replace("+00:00", "Z")
    return next(
        (
            row
            for row in rows
            if row["start"] in (starts, slot.start.isoformat()) and row["status"] != "cancelled"
        ),
        None,
    )


def _call(client: httpx.Client, method: str, path: str, key: str, body: Any = None) -> httpx.Response | None:
    try:
        return client.request(method, path, json=body, headers={"Authorization": f"Bearer {key}"})
    except httpx.HTTPError:
        return None


def call_models(
    lab: Lab,
    world: World,
    base: str,
    user: str,
    planned: list[Planned],
    stop: threading.Event,
    rng: random.Random,
) -> None:
    """One person calling the gateway all the time: their booked model during their slots,
    the default model otherwise, and one request in five someone else's lent slot's model when
    one lends; streams and short requests, some hung up early."""
    from django.utils import timezone

    key = world.keys[user]
    mine = [p for p in planned if p.user == user]
    client = httpx.Client(base_url=base, timeout=30)
    while not stop.is_set():
        now = timezone.now()
        slot = next((p for p in mine if p.reservation_id and p.start <= now < p.end), None)
        # Outside a slot, the default models: the stand-ins' and, one request in five, the real one's;
        # one in twenty a model no channel runs, loaded on demand where a channel is free for it.
        draw = rng.random()
        outside = REAL_MODEL if draw < 0.2 else ON_DEMAND_MODEL if draw < 0.25 else "load-1s"
        lent = [
            p for p in planned if p.lend and p.user != user and p.reservation_id and p.start <= now < p.end
        ]
        if slot is None and lent and rng.random() < 0.2:
            outside = f"load-{rng.choice(lent).load}s"  # borrowed, or refused: never the booker's loss
        model = f"load-{slot.load}s" if slot is not None else outside
        stream, hang_up = rng.random() < 0.5, rng.random() < 0.1
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "stream": stream,
        }
        sent = time.time()
        answer = Answer(sent, user, model, 0)
        try:
            with client.stream(
                "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            ) as got:
                answer.status = got.status_code
                if got.status_code != 200:
                    got.read()
                    answer.retry_after = "retry-after" in got.headers
                    try:
                        answer.code = got.json()["error"]["code"]
                    except (ValueError, KeyError, TypeError):
                        answer.code = "(not an error body)"
                else:
                    for _ in got.iter_bytes():
                        if hang_up:
                            answer.hung_up = True
                            break
        except httpx.HTTPError as exc:
            answer.error = type(exc).__name__
        with lab.lock:
            lab.answers.append(answer)
        stop.wait(rng.uniform(0.1, 0.6))


def sample(lab: Lab, stop: threading.Event) -> None:
    """Which preset each channel has ready, and when each booking first became its channel's
    target, every 100 ms (nothing while the database is away)."""
    from django.db import DatabaseError, connection

    from channels_app.models import ChannelRuntime, ChannelTarget

    while not stop.is_set():
        try:
            ready: dict[int, int | None] = dict(
                ChannelRuntime.objects.filter(phase="ready").values_list("channel_id", "preset_id")
            )
            decided = ChannelTarget.objects.exclude(reservation=None).values_list("reservation_id", flat=True)
            now = time.time()
            with lab.lock:
                lab.samples.append((now, ready))
                for reservation_id in decided:
                    if reservation_id is not None:
                        lab.decided.setdefault(reservation_id, now)
        except DatabaseError:
            connection.close()
        stop.wait(0.1)


# How often the judge looks while the week runs, and how long after a slot's start it judges it
# (its samples are in, its load found).
JUDGE_SECONDS = 2.0
# The lifecycle's first retry pause (channels_app.node_worker.lifecycle).
RETRY_FIRST_SECONDS = 30
JUDGE_AFTER_SECONDS = 2.0
# A slot is judged for promise 1 once its end is this far past: its requests' records are in the
# log by then (written within a tick of their end, through Redis); later ones the end judges.
JUDGE_SLOT_AFTER_SECONDS = 3 * TICK + 2.0


def judge(
    lab: Lab, world: World, planned: list[Planned], stop: threading.Event, missed: threading.Event
) -> None:
    """Promises 1, 2 and 5 judged while the week runs, in a lab of their own (the final checks
    judge everything again): each answer as it comes, each booking once its start is past, each
    slot once its end is past and its requests are in the log. A broken promise is printed at
    once, with its story, and sets ``missed`` (``--stop-on-miss`` ends the run there)."""
    from django.db import connection

    live = Lab(began=lab.began)
    # What the run saw so far, shared: a booking a fault kept from its load is not judged (the
    # faults), nor one whose node was down.
    live.samples, live.node_down, live.decided = lab.samples, lab.node_down, lab.decided
    live.faults = lab.faults
    done: set[int] = set()
    answered = 0
    try:
        _judge(lab, world, planned, stop, missed, live, done, answered)
    finally:
        connection.close()  # this thread's own


def _judge(
    lab: Lab,
    world: World,
    planned: list[Planned],
    stop: threading.Event,
    missed: threading.Event,
    live: Lab,
    done: set[int],
    answered: int,
) -> None:
    from django.db import DatabaseError, connection

    slots_judged: set[int] = set()  # for promise 1, once their end is past
    while not stop.wait(JUDGE_SECONDS):
        with lab.lock:
            new_answers = lab.answers[answered:]
        answered += len(new_answers)
        check_answers(live, new_answers)
        due = {
            slot.reservation_id
            for slot in planned
            if slot.reservation_id
            and slot.start.timestamp() + JUDGE_AFTER_SECONDS <= time.time()
            and slot.reservation_id not in done
        }
        told = len(live.violations)

        ended = {
            slot.reservation_id
            for slot in planned
            if slot.reservation_id
            and slot.end.timestamp() + JUDGE_SLOT_AFTER_SECONDS <= time.time()
            and slot.reservation_id not in slots_judged
        }

        def is_due(slot: Planned, due: set[int] = due) -> bool:
            return slot.reservation_id in due

        def has_ended(slot: Any, ended: set[int] = ended) -> bool:
            return slot.pk in ended

        try:
            check_ready_at_start(live, planned, world, judged=is_due)
            check_slots(live, judged=has_ended)
        except DatabaseError:
            connection.close()  # the database is away (a fault): judged on the next look
            del live.violations[told:]
            continue
        done |= due
        slots_judged |= ended
        for violation in live.violations[told:]:
            print(
                f"  promise {violation.promise} broken at {violation.at} s, while running: {violation.what}",
                flush=True,
            )
            missed.set()


# --- The faults ------------------------------------------------------------------


def break_things(
    lab: Lab,
    machines: Machines,
    kinds: list[tuple[float, str]],
    stop: threading.Event,
    rng: random.Random,
    overlap: bool = False,
) -> None:
    """Each fault at its moment (seconds after the lab began), each timed until the lab is whole
    again: one after the other, or with ``overlap`` each at its moment whatever else is broken
    then (a fault waits only for the last one of its own kind)."""
    own_kind = {kind: threading.Lock() for kind in FAULT_KINDS}
    going: list[threading.Thread] = []
    for moment, kind in kinds:
        if stop.wait(max(0.0, lab.began + moment - time.time())):
            break
        if not overlap:
            make_fault(lab, machines, kind, rng)
            continue

        def one(kind: str = kind) -> None:
            from django.db import connection

            with own_kind[kind]:
                make_fault(lab, machines, kind, rng)
            connection.close()  # this thread's own

        going.append(threading.Thread(target=one, daemon=True))
        going[-1].start()
    for thread in going:
        thread.join()


# Nothing can be loaded on the node while one of these lasts (a load on a full disk fails, and
# waits for its retry): promise 5 does not cover a preload that met one.
NODE_DOWN = ("kill node worker", "cut link briefly", "cut link long", "fill a node's disk")


def make_fault(lab: Lab, machines: Machines, kind: str, rng: random.Random) -> None:
    """Break one part now, and wait (at most 60 s) until the lab is whole again."""
    fault = Fault(kind, round(time.time() - lab.began, 2))
    node = rng.choice(list(NODES))
    began = time.time()
    # Known from its first moment: a booking the live judge weighs while the fault lasts is
    # excused as the final check excuses it (an unrecovered fault spans 60 s, a node's spell is open).
    spell = [began, float("inf")]
    with lab.lock:
        lab.faults.append(fault)
        if kind in NODE_DOWN:
            lab.node_down.setdefault(node, []).append(spell)
    if kind == "kill node worker":
        process = machines.nodes[node]
        fault.target = node
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    elif kind == "kill inference process":
        pid, fault.target = _a_ready_process(rng)
        fault.pid = pid
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    elif kind in ("kill scheduler", "kill web"):
        pid = machines.part(b"--beat" if kind == "kill scheduler" else b"slotserve_site.running.web")
        fault.target, fault.pid = str(pid), pid
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    elif kind == "restart redis":
        assert machines.redis is not None
        fault.lost_records = _records_waiting()
        machines.redis.kill()
        machines.redis.wait()
        time.sleep(rng.uniform(1, 2))
        machines.start_redis()
    elif kind == "restart postgresql":
        machines.pg.stop()
        time.sleep(rng.uniform(1, 2))
        machines.pg.start()
    elif kind == "slow webhook receiver":
        slow = next(r for r in lab.webhooks.values() if r.kind == "slow")
        fault.target = slow.url
        slow.stall(12)
        time.sleep(12)
    elif kind == "fill a node's disk":
        fault.target = node
        filler = machines.work / node / "data" / "runs" / "filler"
        with contextlib.suppress(OSError), filler.open("wb") as fill:
            while True:
                fill.write(b"\0" * 65536)
                fill.flush()
        time.sleep(10)
        filler.unlink(missing_ok=True)
    elif kind.startswith("cut link"):
        fault.target = node
        machines.net.link(node, up=False)
        time.sleep(1.5 if kind == "cut link briefly" else 3 * TICK + 3)
        machines.net.link(node, up=True)
    fault.recovered_after = whole_again(machines, began, timeout=60, also=_back(kind, fault, began, machines))
    spell[1] = time.time()


def _a_ready_process(rng: random.Random) -> tuple[int | None, str]:
    from django.db import DatabaseError

    from channels_app.models import ChannelRuntime

    try:
        running = list(
            ChannelRuntime.objects.filter(phase="ready", pid__isnull=False).values_list(
                "pid", "channel__name"
            )
        )
    except DatabaseError:
        return None, ""
    return rng.choice(running) if running else (None, "")


def _back(kind: str, fault: Fault, began: float, machines: Machines) -> Callable[[], bool]:
    """What the broken part itself shows once it is back: the node worker beats again, the
    channel serves from a new process, the scheduler runs again."""
    from channels_app.models import ChannelRuntime, Node

    if kind in ("kill node worker", "cut link briefly", "cut link long"):
        since = datetime.fromtimestamp(began + 0.5, tz=UTC)
        return lambda: Node.objects.filter(name=fault.target, last_heartbeat__gt=since).exists()
    if kind == "kill inference process" and fault.target:
        killed = fault.pid
        return lambda: (
            ChannelRuntime.objects.filter(channel__name=fault.target, phase="ready")
            .exclude(pid=killed)
            .exists()
        )
    if kind == "kill scheduler":
        # Back once its new worker answers, beat within it ticking: a process that only exists (a
        # loaded machine takes seconds to start one) decides nothing yet.
        return lambda: machines.part(b"--beat") not in (None, fault.pid) and _scheduler_answers()
    if kind == "slow webhook receiver":
        from reservations.webhooks.models import Delivery

        # Every delivery that waited for the receiver has reached it.
        return lambda: not Delivery.objects.filter(webhook__url=fault.target, state="pending").exists()
    return lambda: True


def _scheduler_answers() -> bool:
    """Whether the scheduler's Celery worker (``scheduler@<host>``, beat within it) answers a ping."""
    import socket

    from kombu.exceptions import KombuError
    from redis.exceptions import RedisError

    from slotserve_site.celery import app

    try:
        return bool(app.control.ping(destination=[f"scheduler@{socket.gethostname()}"], timeout=0.5))
    except (KombuError, RedisError, OSError):  # the broker away (a fault beside): not back yet
        return False


def whole_again(machines: Machines, began: float, timeout: float, also: Callable[[], bool]) -> float | None:
    """Seconds from ``began`` until the broken part is back (``also``), /health answers 200,
    every node is ready and no channel has failed; None if not within ``timeout``."""
    from django.db import DatabaseError, connection
    from django.utils import timezone

    from channels_app.models import ChannelRuntime, Node

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            healthy = httpx.get(machines.base + "/health", timeout=2).status_code == 200
            nodes_ready = all(node.is_ready(timezone.now()) for node in Node.objects.filter(name__in=NODES))
            failed = ChannelRuntime.objects.filter(phase="failed").exists()
            if healthy and nodes_ready and not failed and also():
                return round(time.time() - began, 2)
        except (httpx.HTTPError, DatabaseError):
            connection.close()
        time.sleep(0.25)
    return None


def fault_moments(args: argparse.Namespace, rng: random.Random, length: float) -> list[tuple[float, str]]:
    """Each kind ``args.rounds`` times, at random moments of the lab's first 80 %."""
    kinds = [kind for kind in FAULT_KINDS for _ in range(args.rounds)]
    rng.shuffle(kinds)
    step = 0.7 * length / len(kinds)
    return [
        (0.1 * length + step * number + rng.uniform(0, step / 3), kind) for number, kind in enumerate(kinds)
    ]


# --- The promises ----------------------------------------------------------------


def check_answers(lab: Lab, answers: list[Answer] | None = None) -> None:
    """Promise 2: no 500, every refusal a documented code, Retry-After where promised."""
    from slotserve_base.vocabulary import ErrorCode

    codes = set(ErrorCode.values)
    for answer in lab.answers if answers is None else answers:
        if answer.status == 0:
            continue  # no answer at all (the web process was down): nothing to judge
        lab.checked(2)
        if answer.status >= 500 and answer.status not in (502, 503):
            lab.violated(
                2, answer.at, f"{answer.user} asked for {answer.model}: {answer.status} {answer.code}"
            )
        elif answer.status != 200 and answer.code not in codes:
            lab.violated(
                2,
                answer.at,
                f"{answer.user}: {answer.status} with code {answer.code!r}, not a documented one",
            )
        elif answer.code in WITH_RETRY_AFTER and not answer.retry_after:
            lab.violated(2, answer.at, f"{answer.user}: {answer.status} {answer.code} without Retry-After")


# A booking approved after its slot began, or less than a snapshot's life before, holds from the
# gateway's next snapshot: within its age limit (SLOTSERVE_GATEWAY_REFRESH_SECONDS, 1 s) and a
# read (docs/faults.md).
LATE_APPROVAL_SECONDS = 1.5
# The longest a caller's request waits before the gateway decides it (the callers' X-SlotServe-Wait).
REQUEST_WAIT_SECONDS = 60
# The longest a caller's request runs once decided (what the checker looks back over).
REQUEST_LONGEST_SECONDS = 600
# A request someone else began before a slot ends within this of its start, where the slot lends
# nothing: the gateway's look at its requests in flight (0.25 s) and its snapshot's age (1 s).
SLOT_EDGE_SECONDS = 1.5
# The booker's first token in their slot, with others' requests in flight, within this.
BOOKER_FIRST_TOKEN_SECONDS = 2.0


def check_slots(lab: Lab, judged: Callable[[Any], bool] | None = None) -> dict[str, int]:
    """Promise 1: during an approved slot only the booker is answered by its channel, but for
    borrowed answers of the booked model where the slot lends; the booker's requests in a slot
    that lends never wait their turn. Returns how many answers were borrowed, and how many of
    those the bookers' requests ended. ``judged``: which slots to judge (all by default)."""
    from gateway.models import RequestLog
    from reservations.models import Reservation
    from slotserve_base.vocabulary import ErrorCode

    for slot in Reservation.objects.filter(status__in=["approved", "ended"]).select_related(
        "user", "channel", "model"
    ):
        if judged is not None and not judged(slot):
            continue
        lab.checked(1)
        lends = slot.lend and slot.channel.lend_while_idle and not slot.exclusive
        if lends:
            for row in RequestLog.objects.filter(reservation_id=slot.pk, queued_ms__gt=0)[:5]:
                lab.violated(
                    1,
                    row.at.timestamp(),
                    f"{slot.user.username}'s request {row.request_id} waited {row.queued_ms:.0f} ms for a "
                    f"place in their own lent slot {slot.pk}",
                )
        approved = slot.reviewed_at or slot.created
        holds_from = max(slot.start, approved + timedelta(seconds=LATE_APPROVAL_SECONDS))
        # A request is judged by when it was served: from the moment the gateway decided it (its
        # arrival and decided_ms: it may have waited for a snapshot or its turn) to its end. One
        # decided before the slot that ran on into it must have become borrowed (a slot that
        # lends) or ended at the slot's edge (docs/gateway.md, "A slot's first second").
        others = RequestLog.objects.filter(
            channel_id=slot.channel_id,
            status=200,
            at__gte=holds_from - timedelta(seconds=REQUEST_WAIT_SECONDS + REQUEST_LONGEST_SECONDS),
            at__lt=slot.end,
        ).exclude(user_id=slot.user_id)
        found = 0
        served: list[tuple[datetime, datetime]] = []  # others' requests served in the slot
        for row in others.select_related("user"):
            decided = row.at + timedelta(milliseconds=row.decided_ms or 0)
            ended = row.at + timedelta(milliseconds=row.duration_ms)
            if decided >= slot.end or ended <= holds_from:
                continue
            served.append((row.at, ended))
            if lends and row.borrowed and slot.model is not None and row.served_model == slot.model.name:
                continue  # borrowed while the booker was idle, as the booker chose
            if decided < holds_from and ended <= holds_from + timedelta(seconds=SLOT_EDGE_SECONDS):
                continue  # begun before the slot, ended at its edge
            if found == 5:
                continue
            found += 1
            into = "was let onto" if decided >= holds_from else "ran on into"
            lab.violated(
                1,
                max(decided, holds_from).timestamp(),
                f"{row.user.username} {into} channel {slot.channel_id} "
                f"{(decided - slot.start).total_seconds():.2f} s into {slot.user.username}'s slot {slot.pk} "
                f"({row.method} {row.path} for {row.model}, served {row.served_model}, in booking "
                f"{row.reservation_id}, arrived {(row.at - slot.start).total_seconds():.2f} s into it, "
                f"{row.duration_ms:.0f} ms, ended {(ended - slot.start).total_seconds():.2f} s into it, "
                f"request {row.request_id})",
            )
        # The booker's wait is judged by their first token: none waits behind another's request.
        late = RequestLog.objects.filter(
            reservation_id=slot.pk, ttft_ms__gt=BOOKER_FIRST_TOKEN_SECONDS * 1000
        ).order_by("at")
        node = slot.channel.name.rsplit("-", 1)[0]
        for row in late[:5]:
            behind = [span for span in served if span[0] <= row.at < span[1]]
            waited = (row.at.timestamp(), row.at.timestamp() + (row.ttft_ms or 0) / 1000)
            if behind and not on_its_path(lab, node, *waited):
                lab.violated(
                    1,
                    row.at.timestamp(),
                    f"{slot.user.username}'s request {row.request_id} in their slot {slot.pk} had its first "
                    f"token after {row.ttft_ms:.0f} ms, with {len(behind)} request(s) of others' in flight",
                )
    borrowed = RequestLog.objects.filter(borrowed=True)
    return {
        "borrowed": borrowed.count(),
        "preempted": borrowed.filter(error_code=ErrorCode.PREEMPTED_BY_BOOKER).count(),
    }


# Faults that stall a request on its way (docs/faults.md): its node's link cut, the stores the
# gateway reads and counts in restarted. A first token late through one was not waiting for others.
ON_THE_PATH = ("cut link briefly", "cut link long", "restart postgresql", "restart redis")


def fault_span(lab: Lab, fault: Fault) -> tuple[float, float]:
    """When a fault began and when the lab was whole again (wall clock; 60 s if it never was)."""
    down_from = lab.began + fault.at
    return down_from, down_from + (fault.recovered_after if fault.recovered_after is not None else 60)


def on_its_path(lab: Lab, node: str, begin: float, end: float) -> bool:
    """Whether a fault on the way of a request to ``node`` lasted into ``[begin, end]``."""
    for fault in lab.faults:
        if fault.kind not in ON_THE_PATH or (fault.kind.startswith("cut link") and fault.target != node):
            continue
        down_from, down_to = fault_span(lab, fault)
        if down_from <= end and down_to >= begin:
            return True
    return False


def _records_waiting() -> int:
    """The request records in Redis, not yet in the database (what a Redis restart loses)."""
    from redis.exceptions import RedisError

    from slotserve_base.redis_client import redis_client
    from slotserve_base.vocabulary import RedisKey, redis_key

    try:
        return int(redis_client().llen(redis_key(RedisKey.REQUEST_LOG, "all")))
    except RedisError:
        return 0


def log_settled(timeout: float) -> bool:
    """Wait until the request log has settled: nothing waiting in Redis, and no new row over three
    ticks (a count out that waited in a gateway while Redis was away is sent again within one);
    False if it had not within ``timeout`` seconds."""
    from django.db import connections

    from gateway.models import RequestLog

    deadline, rows = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        time.sleep(3 * TICK)
        try:
            now = RequestLog.objects.count()
        except Exception:  # noqa: BLE001 — this thread's connection did not outlive a restart
            connections.close_all()
            continue
        if now == rows and _records_waiting() == 0:
            return True
        rows = now
    return False


def check_log(lab: Lab, settled: bool = True) -> dict[str, int]:
    """Promise 3: every answer a caller received is in the request log, once."""
    from django.db.models import Count

    from gateway.models import RequestLog

    logged = {
        row["user__username"]: row["n"]
        for row in RequestLog.objects.filter(status=200).values("user__username").annotate(n=Count("pk"))
    }
    received: dict[str, int] = {}
    hung: dict[str, int] = {}
    for answer in lab.answers:
        if answer.status != 200:
            continue
        if answer.hung_up or answer.error:
            hung[answer.user] = hung.get(answer.user, 0) + 1
        else:
            received[answer.user] = received.get(answer.user, 0) + 1
    totals = {"received": 0, "logged": 0}
    missing: dict[str, int] = {}
    for user in set(received) | set(logged):
        lab.checked(3)
        got, kept = received.get(user, 0), logged.get(user, 0)
        totals["received"] += got
        totals["logged"] += kept
        if kept < got:
            missing[user] = got - kept
        if kept > got + hung.get(user, 0):
            lab.violated(
                3,
                time.time(),
                f"{user}: {kept} in the request log, only {got + hung.get(user, 0)} answered",
                kind="twice",
            )
    # Records still in Redis when it restarted are lost, exactly those (docs/faults.md).
    lost = sum(f.lost_records for f in lab.faults if f.kind == "restart redis")
    if sum(missing.values()) > lost:
        each = ", ".join(f"{user} {n}" for user, n in sorted(missing.items()))
        lab.violated(
            3,
            time.time(),
            f"{sum(missing.values())} answers received are not in the request log ({each}); "
            f"{lost} records were in Redis when it restarted; {_records_waiting()} still wait in Redis"
            + ("" if settled else " (the log had not settled within 30 s)"),
            kind="missing",
        )
    twice = (
        RequestLog.objects.values("user__username", "at", "duration_ms", "path")
        .annotate(n=Count("pk"))
        .filter(n__gt=1)
    )
    for row in twice[:10]:
        lab.violated(
            3,
            row["at"].timestamp(),
            f"{row['user__username']}'s request at {row['at']} logged {row['n']} times",
            kind="twice",
        )
    return totals


def load_times(world: World) -> dict[int, float]:
    """Each preset's load time as SlotServe measured it in this lab (the median of its loads
    that succeeded: the stand-in's own time, its start and the probes), by the nominal load."""
    from channels_app.models import LoadRecord

    took: dict[int, list[float]] = {}
    for preset_id, started, finished in LoadRecord.objects.filter(
        succeeded=True, finished__isnull=False
    ).values_list("preset_id", "started", "finished"):
        if finished is not None:
            took.setdefault(preset_id, []).append((finished - started).total_seconds())
    return {
        load: statistics.median(took[preset.pk]) if took.get(preset.pk) else float(load)
        for load, preset in world.presets.items()
    }


def _its_load(world: World, slot: Planned, since: float) -> float | None:
    """Seconds the load of ``slot``'s preset on its channel that began after its room opened took."""
    from channels_app.models import LoadRecord

    record = (
        LoadRecord.objects.filter(
            channel_id=world.channels[slot.channel].pk,
            preset_id=world.presets[slot.load].pk,
            started__gte=datetime.fromtimestamp(since - 0.5, tz=UTC),
            succeeded=True,
            finished__isnull=False,
        )
        .order_by("started")
        .first()
    )
    if record is None or record.finished is None:
        return None
    return (record.finished - record.started).total_seconds()


def _time_the_handover(lab: Lab, slot: Planned, channel_id: int, preset_id: int, since: float) -> None:
    """A covered booking's way to its load: from the moment its channel could first be decided
    for it (its approval, the end of the slot before it, or its preload window's opening, which
    is at least PRELOAD_EXTRA_SECONDS before its start) to that decision (sampled every 100 ms),
    and from the decision to its load's start."""
    from channels_app.models import LoadRecord
    from channels_app.scheduling.decision import PRELOAD_EXTRA_SECONDS

    decided = lab.decided.get(slot.reservation_id)
    due = max(since, slot.start.timestamp() - PRELOAD_EXTRA_SECONDS)
    if decided is None or decided < due - 0.2:
        return  # decided before its due moment (its window's opening depends on its load estimate)
    lab.handover["to decision"].append(max(0.0, decided - due))
    began = (
        LoadRecord.objects.filter(
            channel_id=channel_id,
            preset_id=preset_id,
            started__gte=datetime.fromtimestamp(since - 0.5, tz=UTC),
            started__lte=slot.start,
        )
        .order_by("started")
        .values_list("started", flat=True)
        .first()
    )
    if began is not None:
        lab.handover["to load"].append(max(0.0, began.timestamp() - decided))


def _p50_p95(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered):.2f} / {p95:.2f} s"


def check_ready_at_start(
    lab: Lab, planned: list[Planned], world: World, judged: Callable[[Planned], bool] = lambda slot: True
) -> dict[str, Any]:
    """Promise 5: a booking with room to load (the time from its approval, and from the slot
    before it on its channel, at least its load time + 1 s) on a node that stayed up is ready
    at its start. ``judged``: the slots to judge (the others only give the slot after them its
    room)."""
    from reservations.models import Reservation

    measured = load_times(world)
    kept = {r.pk: r for r in Reservation.objects.filter(status__in=["approved", "ended"])}
    previous_end: dict[str, datetime] = {}
    counts: dict[str, Any] = {"covered": 0, "ready": 0, "not covered": 0}
    uncovered: dict[str, int] = {}  # why, how many
    counts["why not covered"] = uncovered
    for slot in sorted(planned, key=lambda p: p.start):
        reservation = kept.get(slot.reservation_id)
        gap_from = previous_end.get(slot.channel)
        if reservation is not None:
            previous_end[slot.channel] = reservation.end
        if reservation is None or not judged(slot):
            continue
        # Room from its approval (a pending booking is not preloaded) or the slot before it, and
        # the load time of the load that made it ready (the backend's own time on this loaded
        # machine varies by a second or two), else the preset's median.
        since = max(gap_from.timestamp() if gap_from else 0.0, slot.approved_at)
        room = slot.start.timestamp() - since if slot.approved_at else 0.0
        load = _its_load(world, slot, since) or measured[slot.load]
        node = slot.channel.rsplit("-", 1)[0]
        preload_from = slot.start.timestamp() - load - 1
        node_down = any(
            a <= slot.start.timestamp() and b >= preload_from for a, b in lab.node_down.get(node, [])
        ) or _in_an_outage(
            lab,
            slot.channel,
            preload_from,
            slot.start.timestamp(),
            served=(world.channels[slot.channel].pk, world.presets[slot.load].pk),
        )
        seen = [
            (at, ready)
            for at, ready in lab.samples
            if slot.start.timestamp() <= at <= slot.start.timestamp() + 0.3
        ]
        why = (
            "no room" if room < load + 1
            else "node down" if node_down
            else "unobserved" if not seen
            else "ended" if reservation.status != "approved" and reservation.end <= slot.start
            else ""
        )  # fmt: skip
        if why:
            counts["not covered"] += 1
            uncovered[why] = uncovered.get(why, 0) + 1
            continue
        counts["covered"] += 1
        lab.checked(5)
        channel_id, preset_id = world.channels[slot.channel].pk, world.presets[slot.load].pk
        _time_the_handover(lab, slot, channel_id, preset_id, since)
        if seen[0][1].get(channel_id) == preset_id:
            counts["ready"] += 1
        else:
            later = next(
                (
                    at
                    for at, ready in lab.samples
                    if at > slot.start.timestamp() and ready.get(channel_id) == preset_id
                ),
                None,
            )
            from channels_app.models import LoadRecord

            record = (
                LoadRecord.objects.filter(channel_id=channel_id, preset_id=preset_id, started__lte=slot.end)
                .order_by("-started")
                .first()
            )
            began = (
                f"; its load began {(slot.start - record.started).total_seconds():.2f} s before"
                if record
                else ""
            )
            decided = lab.decided.get(slot.reservation_id)
            began += (
                "; "
                + (
                    f"decided {slot.start.timestamp() - decided:.2f} s before"
                    if decided
                    else "never its channel's target"
                )
                + ("" if _its_load(world, slot, since) else "; its load not found")
                + _its_story(channel_id, since, slot.start)
            )
            lab.violated(
                5,
                slot.start.timestamp(),
                f"slot {slot.reservation_id} on {slot.channel} (preset {preset_id}, load {load:.1f} s, "
                f"room {room:.1f} s) "
                f"not ready at its start{began}"
                + (
                    f"; ready {later - slot.start.timestamp():.2f} s late"
                    if later
                    else "; never ready in the slot"
                ),
            )
    return counts


def _its_story(channel_id: int, since: float, start: datetime) -> str:
    """The channel's story from the booking's room to its start, in seconds before the start:
    where the time between the decision and the load went."""
    from channels_app.models import StoryEntry

    entries = StoryEntry.objects.filter(
        channel_id=channel_id, at__gte=datetime.fromtimestamp(since - 1, tz=UTC), at__lte=start
    ).values_list("kind", "at", "data")
    told = ", ".join(
        f"{kind}{_what(kind, data)} {(start - at).total_seconds():.2f}" for kind, at, data in entries
    )
    return f"; its story (s before): {told}" if told else ""


def _what(kind: str, data: dict[str, Any]) -> str:
    """What the story of a miss shows of a happening: a decision's preset, reason and booking, a
    failure's error."""
    if kind == "decided":
        booking = f" #{data['booking_id']}" if data.get("booking_id") else ""
        return f" (preset {data.get('preset_id')}, {data.get('reason')}{booking})"
    if kind == "failed":
        return f" ({str(data.get('error') or '')[:80]})"
    return ""


# Faults that stop every channel's preloading while they last (nothing is decided, stored or
# locked): a booking whose preload falls in one is not covered by promise 5 (docs/faults.md).
EVERYWHERE = ("kill scheduler", "restart postgresql", "restart redis")


def _in_an_outage(
    lab: Lab, channel: str, begin: float, end: float, served: tuple[int, int] | None = None
) -> bool:
    """Whether a fault that stops the preload of ``channel`` lasted into [begin, end]. A kill of
    the booked model's own process (``served``: the channel's and the booking's preset's ids, seen
    ready when it was killed) lasts until its retry: a run that died is retried after the
    retry pause, the default serving meanwhile (docs/scheduling.md, "Retries")."""
    for fault in lab.faults:
        if fault.kind in EVERYWHERE or (fault.kind == "kill inference process" and fault.target == channel):
            down_from, down_to = fault_span(lab, fault)
            if fault.kind == "kill inference process" and served is not None and _ran(lab, served, down_from):
                down_to = max(down_to, down_from + RETRY_FIRST_SECONDS + 1)
            if down_from <= end and down_to >= begin:
                return True
    return False


def _ran(lab: Lab, served: tuple[int, int], at: float) -> bool:
    """Whether the channel's last sample before ``at`` shows the preset ready (``served``)."""
    import bisect

    channel_id, preset_id = served
    index = bisect.bisect_right(lab.samples, at, key=lambda sample: sample[0])  # sampled in time order
    return index > 0 and lab.samples[index - 1][1].get(channel_id) == preset_id


def check_whole(lab: Lab, machines: Machines, world: World) -> None:
    """Promise 6: after the last fault, the lab is whole within 3 ticks and a load."""
    from django.utils import timezone

    from channels_app.models import ChannelRuntime, ChannelTarget, Node
    from slotserve_base.inflight import in_flight_counts
    from slotserve_base.redis_client import redis_client

    deadline = time.time() + 3 * TICK + max(LOAD_SECONDS) + 2
    problems: list[str] = []
    while time.time() < deadline:
        problems = []
        targets = {t.channel_id: (t.model_id, t.preset_id) for t in ChannelTarget.objects.all()}
        for runtime in ChannelRuntime.objects.select_related("channel"):
            wanted = targets.get(runtime.channel_id)
            if (
                wanted is not None
                and wanted[0] is not None
                and (runtime.phase != "ready" or (runtime.model_id, runtime.preset_id) != wanted)
            ):
                problems.append(f"{runtime.channel.name} is {runtime.phase}, not running its decision")
        counts = in_flight_counts(redis_client(), [c.pk for c in world.channels.values()])
        problems += [
            f"channel {cid} counts {n} requests in flight, none are" for cid, n in counts.items() if n
        ]
        owned = set(ChannelRuntime.objects.exclude(pid=None).values_list("pid", flat=True))
        strays = [pid for pid in _standins(machines.work) if pid not in owned]
        problems += [
            f"an inference process (pid {pid}: {_described(pid)}) that no channel owns" for pid in strays
        ]
        problems += [
            f"node {n.name} is not ready"
            for n in Node.objects.filter(name__in=NODES)
            if not n.is_ready(timezone.now())
        ]
        if not problems:
            break
        time.sleep(0.5)
    lab.checked(6)
    for problem in problems:
        lab.violated(6, time.time(), problem)


def _described(pid: int) -> str:
    """A process's model, port and run id, as its command line and environment say."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "gone"
    said = [
        f"{flag} {argv[i + 1]}" for i, flag in enumerate(argv[:-1]) if flag in ("-m", "--port", "--alias")
    ]
    said += [v for v in environ if v.startswith("SLOTSERVE_RUN_ID=")]
    return ", ".join(said)


def _standins(work: Path) -> list[int]:
    """This lab's inference processes (every node's stand-ins and llama-servers, their models in
    ``work``), by pid."""
    found = []
    marker = str(work).encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                program = cmdline.split(b"\0", 2)[:2]
                runs = b"devtools.standin" in cmdline or any(p.endswith(b"llama-server") for p in program)
                if runs and marker in cmdline and state != "Z":
                    found.append(int(entry.name))
    return found


def check_confirmed(lab: Lab) -> None:
    """Promise 7: every booking the API confirmed is there, in the state it was left in."""
    from reservations.models import Reservation

    stored = dict(Reservation.objects.values_list("pk", "status"))
    for reservation_id, status in lab.confirmed.items():
        lab.checked(7)
        now = stored.get(reservation_id)
        allowed = {"approved": {"approved", "ended"}, "pending": {"pending", "approved", "ended"}}.get(
            status, {status}
        )
        if now not in allowed:
            how = lab.told.get(reservation_id, "")
            lab.violated(
                7, time.time(), f"booking {reservation_id} was confirmed {status} ({how}), is now {now}"
            )
    from reservations.webhooks.models import Webhook

    kept = set(Webhook.objects.filter(pk__in=list(lab.webhooks)).values_list("pk", flat=True))
    for webhook_id, receiver in lab.webhooks.items():
        lab.checked(7)
        if webhook_id not in kept:
            lab.violated(7, time.time(), f"the {receiver.kind} webhook ({webhook_id}) the API made is gone")


# --- The run ---------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--days", type=float, default=7)
    parser.add_argument("--hour-seconds", type=float, default=4.0)
    parser.add_argument("--bookings", type=int, default=300)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument(
        "--rounds", type=int, default=0, help="times each fault kind is made (default: one a day)"
    )
    parser.add_argument(
        "--overlap", action="store_true", help="a fault may begin while others are not yet over"
    )
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the lab's folder (every process's log, the database's) and print where it is",
    )
    parser.add_argument(
        "--short", action="store_true", help="one compressed day, each fault once: the suite's run"
    )
    parser.add_argument(
        "--stop-on-miss",
        action="store_true",
        help="end the run at the first promise (2 or 5) broken while it runs, and check what ran",
    )
    args = parser.parse_args()
    if args.short:
        args.days, args.hour_seconds, args.bookings, args.rounds = 1, 4.0, 60, 1
    args.rounds = args.rounds or max(1, round(args.days))

    from devtools.cluster import namespaces_work

    why = namespaces_work()
    if why:
        print(f"chaos_week: {why}", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="slotserve-chaos-"))
    os.chmod(work, 0o755)  # the postgres user reaches its folder inside
    machines = Machines(work, secrets.token_hex(2))
    lab = Lab()
    try:
        machines.up()
        keeper = threading.Thread(target=machines.keep_nodes_running, daemon=True)
        keeper.start()
        world = World(args, work)
        up_by = time.monotonic() + 90
        while not _answers(machines.base + "/health"):  # its web processes are started
            if time.monotonic() > up_by:
                raise SystemExit("chaos_week: the control host's web server did not answer within 90 s")
            time.sleep(0.3)
        make_webhooks(lab, world, machines.base, args.seed)
        from django.utils import timezone

        from channels_app.models import ChannelRuntime

        # The lab begins from a running installation: every channel ready with its default.
        deadline = time.monotonic() + 90
        while ChannelRuntime.objects.filter(phase="ready").count() < len(world.channels):
            if time.monotonic() > deadline:
                raise SystemExit("chaos_week: the channels did not load their default within 90 s")
            time.sleep(0.3)

        begin = timezone.now().replace(microsecond=0) + timedelta(seconds=1)  # whole seconds: the portal's
        planned = plan_week(list(world.channels), list(world.keys), args, rng, begin)
        length = args.days * 24 * args.hour_seconds
        print(
            f"{len(planned)} bookings by {args.users} people on {len(world.channels)} channels over "
            f"{args.days:g} compressed days ({length:.0f} s), {len(FAULT_KINDS) * args.rounds} faults; "
            f"seed {args.seed}",
            flush=True,
        )
        lab.began = time.time()
        stop, stop_faults = threading.Event(), threading.Event()
        threads = [
            threading.Thread(target=book, args=(lab, world, machines.base, planned, stop)),
            threading.Thread(target=sample, args=(lab, stop)),
            *(
                threading.Thread(
                    target=call_models,
                    args=(
                        lab,
                        world,
                        machines.base,
                        user,
                        planned,
                        stop,
                        random.Random(args.seed * 1000 + n),
                    ),
                )
                for n, user in enumerate(world.keys)
            ),
        ]
        faults = threading.Thread(
            target=break_things,
            args=(lab, machines, fault_moments(args, rng, length), stop_faults, rng, args.overlap),
        )
        missed = threading.Event()
        judging = threading.Thread(target=judge, args=(lab, world, planned, stop, missed))
        for thread in [*threads, faults, judging]:
            thread.start()
        ended_early = missed if args.stop_on_miss else threading.Event()
        while faults.is_alive() and not ended_early.is_set():
            faults.join(timeout=0.5)
        ended_early.wait(timeout=max(0.0, lab.began + length - time.time()))
        if ended_early.is_set():
            print("a promise was broken: the run ends here (--stop-on-miss)", flush=True)
            stop_faults.set()
            faults.join()
            planned = [slot for slot in planned if slot.start.timestamp() <= time.time()]
        stop.set()
        judging.join(timeout=60)
        stopped = time.time()
        for thread in threads:
            thread.join(timeout=60)
        from django.db import connections

        connections.close_all()  # this thread's connection did not outlive PostgreSQL's restart
        settled = log_settled(timeout=30)  # the last records reach the request log
        check_answers(lab)
        lending = check_slots(lab)
        totals = {**check_log(lab, settled), **lending}
        ready = check_ready_at_start(lab, planned, world)
        check_whole(lab, machines, world)
        check_confirmed(lab)
        # Promise 4: the last retries (about 30 s of them) are given their time first.
        drained(list(lab.webhooks), timeout=60)
        hooks = check_webhooks(
            lab.webhooks,
            events_expected(lab, stopped),
            lambda at, what: lab.violated(4, at, what),
            lambda count: lab.checked(4, count),
        )
        report(lab, args, totals, ready, hooks)
    finally:
        for receiver in lab.webhooks.values():
            receiver.close()
        machines.down()
        if args.keep:
            print(f"the lab's folder, kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if lab.violations else 0


def report(
    lab: Lab, args: argparse.Namespace, totals: dict[str, int], ready: dict[str, Any], hooks: dict[str, int]
) -> None:
    by_kind: dict[str, list[Fault]] = {}
    for fault in lab.faults:
        by_kind.setdefault(fault.kind, []).append(fault)
    print(f"\n{'fault':<24}{'made':>6}{'recovered':>11}{'p50 s':>8}{'p95 s':>8}")
    for kind in FAULT_KINDS:
        made = by_kind.get(kind, [])
        times = sorted(f.recovered_after for f in made if f.recovered_after is not None)
        p50 = f"{statistics.median(times):.1f}" if times else "-"
        p95 = f"{times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]:.1f}" if times else "-"
        print(f"{kind:<24}{len(made):>6}{len(times):>11}{p50:>8}{p95:>8}")
    answered = [a for a in lab.answers if a.status]
    print(
        f"\n{len(lab.answers)} requests ({len(answered)} answered, "
        f"{sum(a.status == 200 for a in answered)} with 200); "
        f"{totals['received']} answers received whole, {totals['logged']} answers of 200 logged; "
        f"{len(lab.confirmed)} bookings confirmed ({lab.booked_again} tried again while the control host "
        f"was away); ready at start {ready['ready']}/{ready['covered']} "
        f"({ready['not covered']} not covered: "
        + (", ".join(f"{n} {why}" for why, n in sorted(ready["why not covered"].items())) or "none")
        + "); "
        f"{hooks['deliveries']} webhook deliveries, {hooks['received']} events handled by the receivers; "
        f"{totals['borrowed']} requests borrowed in lent slots, {totals['preempted']} of them ended by "
        "their bookers' requests"
    )
    print(
        f"a covered booking's due moment → its decision p50 / p95 {_p50_p95(lab.handover['to decision'])}; "
        f"its decision → its load began {_p50_p95(lab.handover['to load'])}"
    )
    overlapped = sum(
        1
        for number, one in enumerate(lab.faults)
        for other in lab.faults[number + 1 :]
        if one.at < other.at + (other.recovered_after or 60)
        and other.at < one.at + (one.recovered_after or 60)
    )
    if overlapped:
        print(f"{overlapped} pairs of faults overlapped")
    from channels_app.models import OnDemandLoad

    loads = list(OnDemandLoad.objects.values_list("released_why", flat=True))
    asked = [a for a in answered if a.model == ON_DEMAND_MODEL]
    released = ", ".join(f"{loads.count(why)} {why or 'not yet'}" for why in sorted(set(loads)))
    print(
        f"{ON_DEMAND_MODEL}: {len(asked)} answers ({sum(a.status == 200 for a in asked)} with 200), "
        f"{len(loads)} loads on demand, released: {released or 'none'}"
    )
    if lab.refused:
        print("bookings not made: " + "; ".join(f"{n} {why}" for why, n in sorted(lab.refused.items())))
    print(f"\n{'promise':<10}{'checks':>8}{'violations':>12}")
    for promise in (1, 2, 3, 4, 5, 6, 7):
        broken = sum(v.promise == promise for v in lab.violations)
        print(f"{promise:<10}{lab.checks.get(promise, 0):>8}{broken:>12}")
    print("\nfaults: " + "; ".join(f"{f.at:.0f} s {f.kind} {f.target}".rstrip() for f in lab.faults))
    for violation in lab.violations[:50]:
        print(f"  promise {violation.promise} at {violation.at:.2f} s: {violation.what}")
    if len(lab.violations) > 50:
        print(f"  … and {len(lab.violations) - 50} more")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "seed": args.seed,
                    "days": args.days,
                    "hour_seconds": args.hour_seconds,
                    "faults": [asdict(f) for f in lab.faults],
                    "checks": lab.checks,
                    "violations": [asdict(v) for v in lab.violations],
                    "requests": len(lab.answers),
                    "bookings_confirmed": len(lab.confirmed),
                    "booked_again": lab.booked_again,
                    "refused": lab.refused,
                    "ready_at_start": ready,
                    "handover": lab.handover,
                    "log": totals,
                    "webhooks": hooks,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    sys.exit(main())
