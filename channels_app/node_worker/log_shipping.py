"""Run-log lines travel from the node to the control plane through Redis.

The process writes its output to a file on its node (``data/runs/<channel>/<run>.log``); a
web host elsewhere has no such file. So the node worker follows each run's file and adds its
lines to a bounded Redis stream per channel (``<prefix>:runlog:<channel>``, the last
``STREAM_MAXLEN`` lines), and the run log page and ``GET /api/channels/{id}/log`` read the
stream from any host. A stream rather than an endpoint on the node: the nodes already reach
Redis, the web host needs no way into the nodes, and a node that is away leaves its last
lines readable. (``run_logs.py`` redacts the run's secret when lines are shown.)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from slotserve_base.api_fields import is_id
from slotserve_base.redis_client import redis_client
from slotserve_base.vocabulary import RedisKey, redis_key

log = logging.getLogger(__name__)

STREAM_MAXLEN = 5000
POLL_SECONDS = 0.2

# The followers this node worker runs, by run id.
_followers: dict[str, threading.Event] = {}
_lock = threading.Lock()


def stream_key(channel_id: int) -> str:
    return redis_key(RedisKey.RUN_LOG, channel_id)


def _add(channel_id: int, run_id: str, lines: list[str]) -> None:
    if not lines:
        return
    pipe = redis_client().pipeline(transaction=False)
    for line in lines:
        pipe.xadd(
            stream_key(channel_id), {"run": run_id, "line": line}, maxlen=STREAM_MAXLEN, approximate=True
        )
    pipe.execute()


def ship_file(channel_id: int, run_id: str, path: Path) -> None:
    """Add a whole, finished file (a launch that failed before any process ran)."""
    try:
        _add(channel_id, run_id, path.read_text(errors="replace").splitlines())
    except (OSError, RedisError):
        log.warning("could not ship the run log %s", path, exc_info=True)


def follow(channel_id: int, run_id: str, path: Path, *, alive: Callable[[], bool], from_start: bool) -> None:
    """Follow ``path`` in a thread of this worker, shipping each complete line, until the run
    ends and its last lines are out. A second call for the same run does nothing."""
    with _lock:
        if run_id in _followers:
            return
        stop = _followers[run_id] = threading.Event()
    thread = threading.Thread(
        target=_follow,
        args=(channel_id, run_id, path, alive, from_start, stop),
        name=f"log {run_id}",
        daemon=True,
    )
    thread.start()


def following(run_id: str) -> bool:
    with _lock:
        return run_id in _followers


def _follow(
    channel_id: int,
    run_id: str,
    path: Path,
    alive: Callable[[], bool],
    from_start: bool,
    stop: threading.Event,
) -> None:
    try:
        with path.open("rb") as source:
            if not from_start:
                source.seek(0, 2)  # adopted: what was written before is in the stream already
            pending = b""
            quiet_rounds = 0
            while not stop.is_set():
                chunk = source.read(65536)
                if chunk:
                    quiet_rounds = 0
                    pending += chunk
                    *complete, pending = pending.split(b"\n")
                    try:
                        _add(channel_id, run_id, [c.decode(errors="replace") for c in complete])
                    except RedisError:  # Redis away: these lines are lost to the page, not to the file
                        log.warning("could not ship run-log lines of run %s", run_id, exc_info=True)
                    continue
                if not alive():
                    quiet_rounds += 1
                    if quiet_rounds >= 2:  # the process is gone and its last lines are read
                        if pending:
                            _add(channel_id, run_id, [pending.decode(errors="replace")])
                        return
                stop.wait(POLL_SECONDS)
    except (OSError, RedisError):
        log.warning("stopped following the run log of run %s", run_id, exc_info=True)
    finally:
        with _lock:
            _followers.pop(run_id, None)


def recent(channel_id: int, count: int) -> list[str]:
    """The last ``count`` lines of the channel's latest run, oldest first ([] if none shipped)."""
    return recent_with_cursor(channel_id, count)[0]


def recent_with_cursor(channel_id: int, count: int) -> tuple[list[str], str]:
    """The last ``count`` lines of the latest run, and the cursor to ask for the lines after them."""
    entries: Any = redis_client().xrevrange(stream_key(channel_id), count=max(count, 1))
    if not entries:
        return [], "0"
    latest = entries[0][1].get(b"run")
    lines = [_line(fields) for _, fields in entries if fields.get(b"run") == latest]
    return list(reversed(lines)), _cursor(entries[0][0])


def lines_after(channel_id: int, cursor: str, count: int) -> tuple[list[str], str, bool]:
    """Lines shipped after ``cursor`` (at most ``count``), the new cursor, and whether a new run
    began after it (then only the newest run's lines are given, as a page shows one run)."""
    entries: Any = redis_client().xrange(stream_key(channel_id), min=f"({cursor}", count=max(count, 1))
    if not entries:
        return [], cursor, False
    newest = entries[-1][1].get(b"run")
    before: Any = (
        redis_client().xrevrange(stream_key(channel_id), max=cursor, count=1) if cursor != "0" else []
    )
    runs = {fields.get(b"run") for _, fields in entries} | {fields.get(b"run") for _, fields in before}
    lines = [_line(fields) for _, fields in entries if fields.get(b"run") == newest]
    return lines, _cursor(entries[-1][0]), len(runs) > 1


def valid_cursor(cursor: str) -> bool:
    """Whether ``cursor`` has the form of a stream position (``<ms>-<seq>`` or ``0``)."""
    head, _, tail = cursor.partition("-")
    return is_id(head) and (is_id(tail) or (not tail and "-" not in cursor))


def _line(fields: Any) -> str:
    return bytes(fields[b"line"]).decode(errors="replace")


def _cursor(entry_id: Any) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
