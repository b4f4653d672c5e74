"""The parts ``manage.py run`` starts and supervises, as the command lines that start them: the
web server (pages, API and gateway), the scheduler (Celery beat and its worker), the webhooks'
worker. The node worker and the embedded Redis are started as they are (``run``)."""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

from django.conf import settings


def web_command(*, fd: int | None = None, host: str = "127.0.0.1", port: int = 8000) -> list[str]:
    """One process of the web part (slotserve_site.running.web): on the listening socket ``fd``
    that ``manage.py run`` holds, or alone on ``host:port``."""
    where = ["--fd", str(fd)] if fd is not None else ["--host", host, "--port", str(port)]
    return [sys.executable, "-m", "slotserve_site.running.web", *where]


def web_options() -> dict[str, Any]:
    """How each web process serves: uvicorn with uvloop and httptools, measured faster than
    daphne for the gateway's streams; the gateway's requests through its own HTTP server
    (gateway.serve.server), the rest through uvicorn's (bench/gateway_bench.py,
    docs/benchmarks.md). At most ``SLOTSERVE_GATEWAY_MAX_CONNECTIONS`` connections and requests at
    once (more get a 503 in the caller's API's shape). An idle connection is kept
    ``SLOTSERVE_KEEP_ALIVE_SECONDS`` (65 s), past a person's pause and a load balancer's idle
    timeout. The client's address is the socket's: SlotServe reads ``X-Forwarded-For`` itself,
    from the proxies it is told to trust (slotserve_site.client_address)."""
    return {
        "app": "slotserve_site.asgi:application",
        "http": "gateway.serve.server:GatewayHttp",
        "lifespan": "off",
        "access_log": False,
        "proxy_headers": False,
        "limit_concurrency": settings.SLOTSERVE_GATEWAY_MAX_CONNECTIONS,
        "timeout_keep_alive": settings.SLOTSERVE_KEEP_ALIVE_SECONDS,
    }


def listen(host: str, port: int) -> socket.socket:
    """The web part's listening socket, bound as uvicorn binds (``SO_REUSEADDR``, a backlog of
    2,048) and left open to the web processes ``run`` starts on it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def default_public_url(host: str, port: int) -> str:
    """The address a start on ``host:port`` is reached at: the machine's name when it listens on
    every address, ``[::1]`` for an IPv6 one."""
    if host in {"0.0.0.0", "::", ""}:
        host = socket.getfqdn()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def web_processes() -> int:
    """``SLOTSERVE_WEB_PROCESSES``, or by default one per CPU core, at most 4, on PostgreSQL and
    one on SQLite (which takes one writer at a time)."""
    if settings.SLOTSERVE_WEB_PROCESSES:
        return int(settings.SLOTSERVE_WEB_PROCESSES)
    if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
        return 1
    return max(1, min(4, len(os.sched_getaffinity(0))))


def celery_worker(name: str, *options: str) -> list[str]:
    """A Celery worker of SlotServe's named ``name`` (``<name>@<host>``) with two processes.

    Without mingle and gossip, as the node workers: SlotServe revokes no task and elects no
    leader, so neither has work to do, and each runs again on every reconnection to Redis (mingle
    waits a second for answers before the worker takes its queue again; gossip's restart fails
    with an error in the log). Remote control stays: a worker answers a ping."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "slotserve_site",
        "--quiet",  # no banner: it would bury what the person starting SlotServe needs
        "worker",
        *options,
        "--without-mingle",
        "--without-gossip",
        "--hostname",
        f"{name}@%h",
        "--loglevel",
        settings.SLOTSERVE_LOG_LEVEL,
        "--concurrency",
        "2",
    ]


def scheduler_command() -> list[str]:
    """The scheduler: beat and the worker of the scheduler's queue (decisions, node news, the
    request log's flush, a slot's edges)."""
    return celery_worker("scheduler", "--beat", "--queues", settings.CELERY_TASK_DEFAULT_QUEUE)


def decisions_command() -> list[str]:
    """The decisions' worker: the only consumer of the decisions' queue (the tick, each
    channel's re-decision), one task at a time, so that a booking's re-decision never waits
    behind the scheduler's long jobs nor in a busy process's prefetch (docs/scheduling.md)."""
    from slotserve_base.dispatch import decisions_queue

    return celery_worker("decisions", "--queues", decisions_queue(), "--prefetch-multiplier", "1")


def webhooks_command() -> list[str]:
    """The webhooks' worker: the only consumer of the webhooks' queue, so that a slow receiver
    holds its processes and none of the scheduler's (docs/webhooks.md, "Delivery")."""
    from slotserve_base.dispatch import webhook_queue

    return celery_worker("webhooks", "--queues", webhook_queue())
