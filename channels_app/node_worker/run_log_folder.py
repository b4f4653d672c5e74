"""Each channel's run-log folder (``DATA_DIR/runs/<channel>``) keeps its last
``SLOTSERVE_RUN_LOGS_KEPT`` runs: a real server logs every request, and a folder of every run
ever would fill its disk (where a load that cannot write its log fails, docs/node-workers.md).
A run's log goes with its config file; the note of a start that failed stays."""

from __future__ import annotations

import contextlib
from pathlib import Path

START_FAILURE = "start-failure.log"


def to_delete(runs: list[tuple[str, float]], *, keep: int, live: set[str]) -> list[str]:
    """The run ids whose files go before a new run starts: all but the ``keep - 1`` newest
    (``runs``: run id and its log's last change), never a run in ``live``."""
    newest_first = sorted(runs, key=lambda run: run[1], reverse=True)
    return [run_id for run_id, _ in newest_first[max(keep - 1, 0) :] if run_id not in live]


def prune(log_dir: Path, *, keep: int, live: set[str]) -> int:
    """Delete the oldest runs' logs and config files in ``log_dir``; returns how many runs went."""
    runs = []
    with contextlib.suppress(OSError):  # no folder yet
        for path in log_dir.glob("*.log"):
            if path.name != START_FAILURE:
                with contextlib.suppress(OSError):  # gone meanwhile
                    runs.append((path.stem, path.stat().st_mtime))
    gone = to_delete(runs, keep=keep, live=live)
    for run_id in gone:
        for name in (f"{run_id}.log", f"{run_id}.config.yaml"):
            with contextlib.suppress(OSError):
                (log_dir / name).unlink()
    return len(gone)
