"""Sleep and wake of a run on a backend that can (docs/scheduling.md, "Sleep and wake"): vLLM's
sleep mode, started with ``--enable-sleep-mode`` and its development endpoints
(``VLLM_SERVER_DEV_MODE=1``), which SlotServe's middleware guards with the run's secret
(``vllm_guard/slotserve_vllm_guard.py``, docs/security.md).

A sleep or a wake takes seconds on a large model: each is asked in a thread of its own and the
lifecycle watches for its end (``is_sleeping``); a wake that fails is kept here for the next
observation to see."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import httpx
from django.conf import settings

from channels_app.backends import Backend
from channels_app.node_worker import page_cache
from slotserve_base.hosts import url_host

log = logging.getLogger(__name__)

GUARD_DIR = Path(__file__).resolve().parent / "vllm_guard"
GUARD = "slotserve_vllm_guard.RequireSecret"
# Host RAM a sleeper's weights may take: what the file holds, and this much more.
RAM_HEADROOM = 1.2
# How long a sleep or a wake is waited for before the lifecycle's own bound takes over.
ASK_SECONDS = 600.0

_wake_failures: dict[str, str] = {}  # run id → what the process answered to its wake


def enabled_for(backend: str) -> bool:
    """Runs of this backend are started able to sleep (``SLOTSERVE_SLEEP_MODE``)."""
    return bool(settings.SLOTSERVE_SLEEP_MODE) and backend == Backend.VLLM


def launch_args() -> list[str]:
    return ["--enable-sleep-mode", "--middleware", GUARD]


def launch_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """What a run able to sleep is given: the endpoints, and the guard on its Python path."""
    path = [str(GUARD_DIR), *filter(None, [environ.get("PYTHONPATH", "")])]
    return {"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": os.pathsep.join(path)}


def weights_bytes(model_path: str) -> int:
    """What the model's weights take on disk: its file, or a folder's weight files."""
    path = Path(model_path)
    try:
        if path.is_dir():
            files = [*path.glob("*.safetensors"), *path.glob("*.bin"), *path.glob("*.pt")]
            return sum(f.stat().st_size for f in files)
        return path.stat().st_size
    except OSError:
        return 0


def room_for(model_path: str) -> bool:
    """Host RAM holds the model's weights while it sleeps (with some to spare)."""
    size = weights_bytes(model_path)
    try:
        return size > 0 and page_cache.available_bytes() >= size * RAM_HEADROOM
    except (OSError, ValueError):
        return False


def _headers(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"} if secret else {}


def is_sleeping(host: str, port: int, secret: str, timeout: float = 1.0) -> bool | None:
    """What the process says (``GET /is_sleeping``), or None when it does not answer."""
    try:
        answer = httpx.get(
            f"http://{url_host(host)}:{port}/is_sleeping", headers=_headers(secret), timeout=timeout
        )
        said = answer.json().get("is_sleeping") if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return said if isinstance(said, bool) else None


def _ask(run_id: str, url: str, secret: str, what: str) -> None:
    try:
        answer = httpx.post(url, headers=_headers(secret), timeout=ASK_SECONDS)
    except httpx.HTTPError as exc:
        failure = f"{what} failed: {exc}"
    else:
        if answer.status_code == 200:
            return
        failure = f"{what} failed ({answer.status_code}): {answer.text[:300]}"
    log.warning("run %s: %s", run_id, failure)
    if what == "wake":
        _wake_failures[run_id] = failure


def put_to_sleep(run_id: str, host: str, port: int, secret: str) -> None:
    """Ask the run to sleep (level 1: its weights to host RAM, its KV cache dropped)."""
    url = f"http://{url_host(host)}:{port}/sleep?level=1"
    threading.Thread(target=_ask, args=(run_id, url, secret, "sleep"), daemon=True).start()


def wake(run_id: str, host: str, port: int, secret: str) -> None:
    """Ask the run to wake (its weights back on the GPU)."""
    _wake_failures.pop(run_id, None)
    url = f"http://{url_host(host)}:{port}/wake_up"
    threading.Thread(target=_ask, args=(run_id, url, secret, "wake"), daemon=True).start()


def wake_failure(run_id: str) -> str:
    return _wake_failures.get(run_id, "")
