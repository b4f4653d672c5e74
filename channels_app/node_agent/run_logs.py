"""Reading a channel's run log for people: its last lines, or all of it, never with the run's secret."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from channels_app.models import Channel, ChannelRuntime
from channels_app.node_agent import processes


def run_log_of(channel: Channel) -> tuple[Path | None, str]:
    """The channel's current or last run log, and the run's secret to keep out of what is shown."""
    runtime = ChannelRuntime.objects.filter(channel=channel).first()
    if runtime is None or not runtime.log_path or not Path(runtime.log_path).is_file():
        return None, ""
    return Path(runtime.log_path), runtime.api_secret


def tail_lines(path: Path, count: int, secret: str = "") -> list[str]:
    return processes.redact(processes.log_tail(path, limit=count * 400), secret).splitlines()[-count:]


def redacted_lines(path: Path, secret: str) -> Iterator[bytes]:
    with path.open("rb") as log:
        for line in log:
            yield processes.redact(line.decode(errors="replace"), secret).encode()
