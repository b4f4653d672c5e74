"""``manage.py run``: SlotServe on one machine — web, API, gateway, beat and a node worker.

Migrates, creates an admin account on first start (printing its password
once), then supervises daphne and a Celery worker with the beat scheduler.
Ctrl-C stops them all.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

STOP_GRACE_SECONDS = 10


class Command(BaseCommand):
    help = "Run SlotServe on this machine: portal, REST API, scheduler (beat) and a worker."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--admin", default="admin", help="username of the first admin account")

    def handle(self, *args: Any, **options: Any) -> None:
        self._check_redis()
        call_command("migrate", interactive=False, verbosity=0)
        self._first_admin(options["admin"])
        python = sys.executable
        commands = {
            # uvicorn with uvloop and httptools: measured faster than daphne for the
            # gateway's streams (bench/gateway_bench.py, README "Benchmarks").
            "web": [
                python,
                "-m",
                "uvicorn",
                "slotserve_site.asgi:application",
                "--host",
                options["host"],
                "--port",
                str(options["port"]),
                "--lifespan",
                "off",
                "--no-access-log",
            ],
            "scheduler": [
                python,
                "-m",
                "celery",
                "-A",
                "slotserve_site",
                "worker",
                "--beat",
                "--loglevel",
                "INFO",
                "--concurrency",
                "2",
            ],
            "node": [python, "manage.py", "nodeworker"],
        }
        children = {name: subprocess.Popen(argv, start_new_session=True) for name, argv in commands.items()}
        self.stdout.write(
            f"SlotServe is running on http://{options['host']}:{options['port']}/ (Ctrl-C stops it)"
        )
        stopping = False

        def stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            while not stopping:
                for name, child in children.items():
                    if child.poll() is not None:
                        raise CommandError(
                            f"{name} exited with status {child.returncode}; stopping SlotServe"
                        )
                time.sleep(0.5)
        finally:
            self._stop_all(children)

    def _check_redis(self) -> None:
        try:
            redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2).ping()
        except redis.RedisError as exc:
            raise CommandError(
                f"Redis is not reachable at SLOTSERVE_REDIS_URL={settings.REDIS_URL} ({exc}). "
                "Start one (redis-server) or point SLOTSERVE_REDIS_URL at yours."
            ) from None

    def _first_admin(self, username: str) -> None:
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            return
        password = secrets.token_urlsafe(12)
        users.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(f"Created the admin account {username!r} with password: {password}")
        self.stdout.write("(shown once; change it in the admin under Users)")

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
        self.stdout.write("SlotServe stopped.")
