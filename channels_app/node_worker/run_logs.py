"""Reading a channel's run log for people, from any host: its last lines, or all of it, never
with the run's secret. The lines come from the Redis stream the node worker fills
(``log_shipping``); the file itself only where this host is the node that wrote it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from redis.exceptions import RedisError

from channels_app.models import Channel, ChannelRuntime
from channels_app.node_worker import log_shipping, processes


def run_log_of(channel: Channel) -> tuple[Path | None, str]:
    """The channel's current or last run log if it is on this host, and the run's secret."""
    runtime = ChannelRuntime.objects.filter(channel=channel).first()
    if runtime is None:
        return None, ""
    path = Path(runtime.log_path) if runtime.log_path and Path(runtime.log_path).is_file() else None
    return path, runtime.api_secret


def recent_lines(channel: Channel, count: int) -> list[str]:
    """The last ``count`` lines of the channel's latest run, redacted, from wherever they are
    (the file itself where this host wrote it and nothing was shipped yet)."""
    return recent_lines_with_cursor(channel, count)[0]


def lines_since(channel: Channel, cursor: str, count: int) -> tuple[list[str], str, bool]:
    """Lines shipped after ``cursor``, redacted; the next cursor; whether a new run began."""
    _, secret = run_log_of(channel)
    lines, cursor, new_run = log_shipping.lines_after(channel.pk, cursor, count)
    return [processes.redact(line, secret) for line in lines], cursor, new_run


def recent_lines_with_cursor(channel: Channel, count: int) -> tuple[list[str], str]:
    """:func:`recent_lines` and the cursor that follows them (``"0"`` when none were shipped)."""
    path, secret = run_log_of(channel)
    try:
        lines, cursor = log_shipping.recent_with_cursor(channel.pk, count)
    except RedisError:
        lines, cursor = [], "0"
    if not lines and path is not None:
        return tail_lines(path, count, secret), cursor
    return [processes.redact(line, secret) for line in lines], cursor


def tail_lines(path: Path, count: int, secret: str = "") -> list[str]:
    return processes.redact(processes.log_tail(path, limit=count * 400), secret).splitlines()[-count:]


def whole_log(channel: Channel) -> Iterator[bytes] | None:
    """All of the latest run's log: the file on this host, else every line the stream holds."""
    path, secret = run_log_of(channel)
    if path is not None:
        return redacted_lines(path, secret)
    lines = recent_lines(channel, log_shipping.STREAM_MAXLEN)
    return (f"{line}\n".encode() for line in lines) if lines else None


def redacted_lines(path: Path, secret: str) -> Iterator[bytes]:
    with path.open("rb") as log:
        for line in log:
            yield processes.redact(line.decode(errors="replace"), secret).encode()


# Lines about single requests (llama-server's slots and tasks, their timings and prompt-cache
# similarity; vLLM's and SGLang's requests): staff read them, members the rest of a run log.
REQUEST_LINE = re.compile(
    r"\|\s*task\s+-?\d+|log_server_r|sim_best|similarity|eval time|total time|n_tokens|n_past"
    r"|\brequest[: ]|Received request|Finished request|request_id|rid=",
    re.IGNORECASE,
)


def for_member(lines: list[str]) -> list[str]:
    """A run log's lines as a member reads them: none about a single request."""
    return [line for line in lines if not REQUEST_LINE.search(line)]
