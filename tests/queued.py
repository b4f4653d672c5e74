"""Tasks queued as a deployment queues them, and a worker the test runs by hand.

The tests' Celery application publishes to Celery's in-memory broker (kombu's ``memory://``
transport): a task is serialised, routed to its queue and kept there, exactly as on Redis,
and nothing runs it until the test says so with ``Queued.run``, in the order the messages
were queued, in the test's own thread (so it sees the test's database transaction). Tests
that need the real thing (Redis, a worker in its own thread or process) switch the broker
back with ``use_broker``.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.contrib.testing.worker import start_worker
from django.db import connections
from django.utils import timezone
from kombu.transport import memory

from slotserve_site.celery import app as celery_app

MEMORY = "memory://"


def use_broker(url: str) -> None:
    """Publish to ``url`` from now on: the application forgets the connections and producers
    of the last broker (what Celery itself does after a fork)."""
    if celery_app.conf.broker_url == url:
        return
    # A worker looks for tasks on the in-memory broker every 10 ms (kombu's default: 1 s).
    options = {"polling_interval": 0.01} if url == MEMORY else {}
    celery_app.conf.update(broker_url=url, broker_transport_options=options)
    # The pools stay open in kombu's registry, one per broker, for the next switch back.
    celery_app._pool = None  # type: ignore[attr-defined]
    celery_app.amqp._producer_pool = None  # type: ignore[attr-defined]


@contextmanager
def broker(url: str) -> Iterator[None]:
    before = celery_app.conf.broker_url
    use_broker(url)
    try:
        yield
    finally:
        use_broker(before)


@contextmanager
def worker(*queues: str) -> Iterator[None]:
    """A real Celery worker, in a thread of this process, taking ``queues``' tasks from the
    in-memory broker as they come, countdowns and retries kept as a deployment keeps them. Its
    database connection is its own: the test must commit what it reads
    (``django_db(transaction=True)``)."""
    started, stop, failed = threading.Event(), threading.Event(), []

    def serve() -> None:
        # Made in its own thread: Celery's Django fixup closes the database connections of the
        # thread that makes a worker, which must not be the test's.
        try:
            with start_worker(
                celery_app,
                pool="solo",
                perform_ping_check=False,
                queues=list(queues),
                loglevel="WARNING",
                shutdown_timeout=10,
            ):
                started.set()
                stop.wait()
        except BaseException as error:  # noqa: BLE001 — the test hears why its worker did not start
            failed.append(error)
        finally:
            connections.close_all()
            started.set()

    thread = threading.Thread(target=serve, name="celery-worker", daemon=True)
    thread.start()
    started.wait(timeout=30)
    if failed:
        raise failed[0]
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=15)


class Queued:
    """What waits on the in-memory broker's queues, and a worker to run it."""

    def names(self) -> list[str]:
        """The names of the tasks waiting, queue by queue, in the order queued."""
        return [
            message["headers"]["task"]
            for _, queue in sorted(memory.Channel.queues.items())
            for message in list(queue.queue)
        ]

    def queues(self) -> dict[str, list[str]]:
        """Each queue that holds a task, and the names of the tasks it holds."""
        return {
            name: [message["headers"]["task"] for message in queue.queue]
            for name, queue in sorted(memory.Channel.queues.items())
            if queue.qsize()
        }

    def run(self, limit: int = 1000) -> list[str]:
        """Run what is queued, and what those tasks queue in turn, until the queues are empty;
        the names of the tasks run. A task past its ``expires`` is dropped unrun, as a worker
        drops it; one with a countdown runs now (the test moves time itself). A task that
        raises fails the test."""
        ran: list[str] = []
        with celery_app.connection_for_read() as connection:
            channel: Any = connection.default_channel
            while len(ran) < limit:
                message = next(
                    (m for q in sorted(memory.Channel.queues) if (m := channel.basic_get(q, no_ack=True))),
                    None,
                )
                if message is None:
                    return ran
                name = message.headers["task"]
                expires = message.headers.get("expires")
                if expires and dt.datetime.fromisoformat(expires) < timezone.now():
                    continue
                args, kwargs, _ = message.decode()
                celery_app.tasks[name].apply(args=args, kwargs=kwargs, throw=True)
                ran.append(name)
        raise AssertionError(f"tasks kept queueing tasks: {limit} run and more waiting")

    def clear(self) -> None:
        for queue in memory.Channel.queues.values():
            queue.queue.clear()
