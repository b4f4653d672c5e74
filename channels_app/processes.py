"""Starting, finding, probing and stopping inference processes. No decisions here.

Each process runs in its own process group with ``SLOTSERVE_RUN_ID`` in its
environment, so a restarted node worker can tell its own processes from a
recycled pid, adopt them, or stop them.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from channels_app.backends import Backend, effective_args

# Popen objects of the processes this worker started, by run id, for their exit codes.
_children: dict[str, subprocess.Popen[bytes]] = {}
LOG_TAIL_BYTES = 16_384


@dataclass(frozen=True)
class Launch:
    """Everything needed to start one run."""

    backend: Backend
    executable: str
    model_path: str
    alias: str
    preset_args: Sequence[str]
    gpu_indexes: Sequence[int]
    host: str
    log_dir: Path


@dataclass(frozen=True)
class Started:
    run_id: str
    pid: int
    port: int
    log_path: Path


def command_line(launch: Launch, port: int) -> list[str]:
    """The argv of a run: the backend's executable, the arguments SlotServe owns
    (API.md "Backend programs"), then the preset's arguments without owned ones."""
    program = shlex.split(launch.executable)
    extra = effective_args(launch.backend, list(launch.preset_args))
    where = ["--host", launch.host, "--port", str(port)]
    if launch.backend == Backend.LLAMA_CPP:
        owned = ["-m", launch.model_path, *where, "--alias", launch.alias]
    elif launch.backend == Backend.VLLM:
        owned = ["serve", launch.model_path, *where, "--served-model-name", launch.alias]
    else:
        owned = ["--model-path", launch.model_path, *where, "--served-model-name", launch.alias]
    return [*program, *owned, *extra]


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def start(launch: Launch) -> Started:
    """Start a run in its own process group, its output to a per-run log file. Never a shell."""
    run_id = uuid.uuid4().hex[:12]
    port = free_port(launch.host)
    launch.log_dir.mkdir(parents=True, exist_ok=True)
    log_path = launch.log_dir / f"{run_id}.log"
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in launch.gpu_indexes)
    env["SLOTSERVE_RUN_ID"] = run_id
    argv = command_line(launch, port)
    with log_path.open("ab") as log:
        log.write(f"$ {shlex.join(argv)}\n".encode())
        log.flush()
        try:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            log.write(f"could not start {argv[0]}: {exc}\n".encode())
            raise
    _children[run_id] = child
    return Started(run_id=run_id, pid=child.pid, port=port, log_path=log_path)


def _run_id_of(pid: int) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(b"SLOTSERVE_RUN_ID="):
            return entry.split(b"=", 1)[1].decode()
    return None


def alive(pid: int, run_id: str) -> tuple[bool, int | None]:
    """Whether run ``run_id`` still runs as ``pid``; else its exit code if this worker knows it."""
    child = _children.get(run_id)
    if child is not None:
        code = child.poll()
        if code is not None:
            _children.pop(run_id, None)
            return False, code
        return True, None
    # Started by an earlier worker: a live pid only counts if it is that run.
    if _run_id_of(pid) == run_id and not _is_zombie(pid):
        return True, None
    return False, None


def _is_zombie(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return status.rsplit(")", 1)[-1].split()[0] == "Z"


def healthy(host: str, port: int, timeout: float = 1.0) -> bool:
    """The backend's ``GET /health`` answers 200 (SPEC §4)."""
    try:
        return httpx.get(f"http://{url_host(host)}:{port}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def url_host(host: str) -> str:
    """How to write ``host`` in a URL that reaches it (a wildcard bind means this machine)."""
    if host in {"0.0.0.0", ""}:
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def send(pid: int, sig: signal.Signals) -> None:
    """Signal the run's whole process group (a backend may have children)."""
    with contextlib.suppress(ProcessLookupError):  # it has exited already: nothing to stop
        os.killpg(pid, sig)


def log_tail(path: str | Path, limit: int = LOG_TAIL_BYTES) -> str:
    try:
        with Path(path).open("rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - limit))
            return log.read().decode(errors="replace")
    except OSError:
        return ""
