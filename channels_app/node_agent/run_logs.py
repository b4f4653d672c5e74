"""Reading a channel's run log for people, from any host: its last lines, or all of it, never
with the run's secret. The lines come from the Redis stream the node worker fills
(``log_shipping``); the file itself only where this host is the node that wrote it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from redis.exceptions import RedisError

from channels_app.models import Channel, ChannelRuntime
from channels_app.node_agent import log_shipping, processes


def run_log_of(channel: Channel) -> tuple[Path | None, str]:
    """The channel's current or last run log if it is on this host, and the run's secret."""
    runtime = ChannelRuntime.objects.filter(channel=channel).first()
    if runtime is None:
        return None, ""
    path = Path(runtime.log_path) if runtime.log_path and Path(runtime.log_path).is_file() else None
    return path, runtime.api_secret


def recent_lines(channel: Channel, count: int) -> list[str]:
    """The last ``count`` lines of the channel's latest run, redacted, from wherever they are."""
    path, secret = run_log_of(channel)
    try:
        lines = log_shipping.recent(channel.pk, count)
    except RedisError:
        lines = []
    if not lines and path is not None:  # not shipped (yet): this host wrote it
        return tail_lines(path, count, secret)
    return [processes.redact(line, secret) for line in lines]


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
