"""Starting, finding, probing and stopping inference processes. No decisions here.

Each process runs in its own process group with ``SLOTSERVE_RUN_ID`` in its
environment, so a restarted node worker can tell its own processes from a
recycled pid, adopt them, or stop them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import secrets
import shlex
import signal
import subprocess
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from channels_app.backends import API_KEY_ENV, Backend, effective_args
from channels_app.node_worker import sleep_mode
from channels_app.node_worker.ports import free_port
from slotserve_base.hosts import url_host

# Popen objects of the processes this worker started, by run id, for their exit codes.
_children: dict[str, subprocess.Popen[bytes]] = {}
# The exit codes of those that ended, kept (an int a run) for every look after the first.
_exit_codes: dict[str, int] = {}
_unwritten: dict[str, str] = {}  # log path → why its run could not start (a full disk refused it)
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
    extra_env: Sequence[str] = field(default=())  # SLOTSERVE_PROCESS_ENV: more names to pass on
    ports: range | None = None  # SLOTSERVE_PROCESS_PORTS; None: the kernel picks
    sleep_mode: bool = False  # started able to sleep (node_worker.sleep_mode)


@dataclass(frozen=True)
class Started:
    run_id: str
    pid: int
    port: int
    log_path: Path
    secret: str  # the run's API key: the gateway sends it, nobody else knows it


# What an inference process inherits from the node worker's environment: what the backends
# need to find their libraries, GPUs, caches and locale — never the worker's own secrets
# (DATABASE_URL, SLOTSERVE_SECRET_KEY, SLOTSERVE_REDIS_URL, SMTP passwords, …).
CHILD_ENV_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TERM",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "OPENBLAS_CORETYPE",
        "OPENBLAS_L2_SIZE",
    }
)
CHILD_ENV_PREFIXES = (
    "LC_",
    "XDG_",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "TORCH",
    "TRITON_",
    "VLLM_",
    "SGLANG_",
    "LLAMA_ARG_",
    "GGML_",
)
# Set by SlotServe for each run, never inherited.
CHILD_ENV_OWNED = frozenset({"LLAMA_API_KEY", "VLLM_API_KEY", "CUDA_VISIBLE_DEVICES", "SLOTSERVE_RUN_ID"})


def child_environment(
    parent: Mapping[str, str], *, extra_names: Iterable[str] = (), own: Mapping[str, str]
) -> dict[str, str]:
    """The environment of an inference process: the allowlisted part of ``parent``, then ``own``."""
    allowed = CHILD_ENV_NAMES | set(extra_names)
    env = {
        name: value
        for name, value in parent.items()
        if name not in CHILD_ENV_OWNED and (name in allowed or name.startswith(CHILD_ENV_PREFIXES))
    }
    env.update(own)
    return env


def command_line(launch: Launch, port: int, config_path: Path | None = None) -> list[str]:
    """The argv of a run: the backend's executable, the arguments SlotServe owns
    (docs/api.md, "Backend programs"), then the preset's arguments without owned ones.

    The run's secret is never on it (``/proc/<pid>/cmdline`` is world-readable):
    it travels in the environment, or in the config file at ``config_path``.
    """
    program = shlex.split(launch.executable)
    extra = effective_args(launch.backend, list(launch.preset_args))
    where = ["--host", launch.host, "--port", str(port)]
    if launch.backend == Backend.LLAMA_CPP:
        owned = ["-m", launch.model_path, *where, "--alias", launch.alias]
    elif launch.backend == Backend.VLLM:
        owned = ["serve", launch.model_path, *where, "--served-model-name", launch.alias]
    else:
        owned = ["--model-path", launch.model_path, *where, "--served-model-name", launch.alias]
    if config_path is not None:
        owned += ["--config", str(config_path)]
    if launch.sleep_mode:
        owned += sleep_mode.launch_args()
    return [*program, *owned, *extra]


def _private_file(path: Path, data: bytes = b"") -> None:
    """Create ``path`` readable by its owner only (0600), whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def private_dir(path: Path) -> None:
    """Create ``path`` (and its parents) readable by its owner only (0700)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)


def redact(text: str, secret: str) -> str:
    """``text`` without ``secret``, and without any ``--api-key VALUE`` it shows."""
    if secret:
        text = text.replace(secret, "[redacted]")
    return re.sub(r"(--api-key[= ])\S+", r"\1[redacted]", text)


def start(launch: Launch) -> Started:
    """Start a run in its own process group, its output to a per-run log file. Never a shell."""
    run_id = uuid.uuid4().hex[:12]
    port = free_port(launch.host, launch.ports)
    private_dir(launch.log_dir)
    log_path = launch.log_dir / f"{run_id}.log"
    secret = secrets.token_urlsafe(32)
    own = {
        # NVML numbers GPUs by PCI bus; CUDA by speed unless told otherwise.
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in launch.gpu_indexes),
        "SLOTSERVE_RUN_ID": run_id,
    }
    config_path = None
    key_variable = API_KEY_ENV[launch.backend]
    if key_variable is not None:
        own[key_variable] = secret
    else:
        config_path = launch.log_dir / f"{run_id}.config.yaml"
        _private_file(config_path, f"api-key: {secret}\n".encode())
    if launch.sleep_mode:
        own |= sleep_mode.launch_env()
    env = child_environment(os.environ, extra_names=launch.extra_env, own=own)
    argv = command_line(launch, port, config_path)
    _private_file(log_path)
    log = log_path.open("ab")
    try:
        log.write(f"$ {shlex.join(argv)}\n".encode())
        log.flush()
    except OSError as exc:  # a full disk: the file is closed, what it holds cannot be written
        with contextlib.suppress(OSError):
            log.close()
        raise OSError(
            exc.errno, f"its run log cannot be written in {launch.log_dir}: {exc.strerror}"
        ) from exc
    with log:
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
    return Started(run_id=run_id, pid=child.pid, port=port, log_path=log_path, secret=secret)


def run_id_of(pid: int) -> str | None:
    """The run id in process ``pid``'s environment (``start``), if it has one."""
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
    if run_id in _exit_codes:
        return False, _exit_codes[run_id]
    child = _children.get(run_id)
    if child is not None:
        code = child.poll()
        if code is not None:
            # Every later look learns it too: the log shipper looks as often as the reconcile.
            _exit_codes[run_id] = code
            _children.pop(run_id, None)
            return False, code
        return True, None
    # Started by an earlier worker: a live pid only counts if it is that run.
    if run_id_of(pid) == run_id and not _is_zombie(pid):
        return True, None
    return False, None


def children() -> dict[str, int]:
    """The runs this worker started that still run (or are not reaped yet): run id → pid."""
    return {run_id: child.pid for run_id, child in list(_children.items())}


def _is_zombie(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return status.rsplit(")", 1)[-1].split()[0] == "Z"


@functools.cache
def _probes() -> httpx.Client:
    """The client of the node's probes, made once: a client per probe built a TLS context with
    the system's certificates each time (tens of milliseconds of CPU) for a plain-HTTP request.
    No connection is kept: each probe asks the process as it is now, never a dead one's socket."""
    return httpx.Client(verify=False, trust_env=False, limits=httpx.Limits(max_keepalive_connections=0))


def healthy(host: str, port: int, secret: str = "", timeout: float = 1.0) -> bool:
    """The backend's ``GET /health`` answers 200 (docs/scheduling.md)."""
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    try:
        url = f"http://{url_host(host)}:{port}/health"
        return _probes().get(url, headers=headers, timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def slots(host: str, port: int, secret: str = "", timeout: float = 1.0) -> int | None:
    """The requests a ready llama-server serves at once (``GET /props``' ``total_slots``), or
    None when it does not say."""
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    try:
        answer = _probes().get(f"http://{url_host(host)}:{port}/props", headers=headers, timeout=timeout)
        total = answer.json().get("total_slots") if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else None


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
            return log.read().decode(errors="replace") or _unwritten.get(str(path), "")
    except OSError:
        return _unwritten.get(str(path), "")


def write_start_failure(path: Path, line: str) -> None:
    """Why a run could not start, as its log; kept here for ``log_tail`` where the disk refuses it."""
    try:
        private_dir(path.parent)
        path.write_text(line)
        _unwritten.pop(str(path), None)
    except OSError:
        _unwritten[str(path)] = line
