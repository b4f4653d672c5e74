"""A short Redis lock that its holder keeps alive: a dead holder is forgotten within seconds.

A node worker reconciles a channel under its lock, so two reconciles never act on
one process at once. A long fixed lock time freezes the channel for that long
when the worker dies holding it (killed, out of memory, the machine restarted);
a short one could expire under a live holder that is slow. So the lock is short
(``ttl``) and a thread of the holder renews it every third of that while the
work runs: alive, the holder keeps it; dead, it lapses within ``ttl``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.exceptions import LockError, RedisError

log = logging.getLogger(__name__)


def owner_token() -> str:
    """Who holds a lock, readable in Redis: host, process, and a unique part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@contextmanager
def held(client: redis.Redis, name: str, ttl: float) -> Iterator[bool]:
    """Hold the lock ``name`` while the block runs; yields False (and holds nothing) if taken."""
    lock = client.lock(name, timeout=ttl, blocking=False, thread_local=False)
    if not lock.acquire(token=owner_token()):
        yield False
        return
    done = threading.Event()

    def renew() -> None:
        while not done.wait(ttl / 3):
            try:
                lock.reacquire()
            except (LockError, RedisError):
                log.warning("lost the lock %s while holding it", name, exc_info=True)
                return

    keeper = threading.Thread(target=renew, name=f"renew {name}", daemon=True)
    keeper.start()
    try:
        yield True
    finally:
        done.set()
        keeper.join()
        try:
            lock.release()
        except (LockError, RedisError):
            log.warning("the lock %s had lapsed before it was released", name)
