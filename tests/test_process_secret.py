"""Inference processes answer only the gateway: each run's own secret, never on the command
line or in anything users can read; the child's environment holds none of the node worker's
secrets; owned options cannot be smuggled in by abbreviation (docs/security.md)."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from channels_app.models import ChannelRuntime
from channels_app.node_worker import processes
from channels_app.scheduling.services import decide_channels
from slotserve_base.vocabulary import Phase
from tests import factories
from tests.clock import eventually
from tests.test_node_worker import converge

pytestmark = pytest.mark.django_db(transaction=True)

WORKER_SECRETS = {
    "DATABASE_URL": "postgres://slotserve:hunter2@db/slotserve",
    "SLOTSERVE_SECRET_KEY": "k" * 10 + "-a-worker-only-signing-key-0123456789",
    "SLOTSERVE_REDIS_URL": "redis://:hunter2@redis:6379/0",
    "SLOTSERVE_EMAIL_PASSWORD": "smtp-hunter2",
    "AWS_SECRET_ACCESS_KEY": "cloud-hunter2",
}


def _chat(port: int, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=headers, timeout=60)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in raw if b"=" in entry)


def test_a_real_llama_server_refuses_callers_without_the_runs_secret(node_env, tiny, ana, monkeypatch):
    for name, value in WORKER_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LLAMA_API_KEY", "a-key-someone-set-for-their-own-server")
    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    runtime = converge(channel, until={Phase.READY})
    secret = runtime.api_secret
    assert len(secret) >= 32

    # A direct call to the port, as a user who read it in the run log would make it.
    refused = _chat(runtime.port, None)
    assert refused.status_code == 401, refused.text
    assert _chat(runtime.port, "a-key-someone-set-for-their-own-server").status_code == 401
    assert _chat(runtime.port, secret).status_code == 200
    # What docs/security.md says stays open, and what does not.
    base = f"http://127.0.0.1:{runtime.port}"
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200
    assert httpx.get(f"{base}/v1/health", timeout=10).status_code == 200
    assert httpx.get(f"{base}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{base}/slots", timeout=10).status_code == 401

    # Not on the command line, which every user of the node can read.
    cmdline = Path(f"/proc/{runtime.pid}/cmdline").read_bytes()
    assert secret.encode() not in cmdline
    # The child's environment: the run's own key, none of the worker's secrets.
    environ = _environ(runtime.pid)
    assert environ["LLAMA_API_KEY"] == secret
    assert environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert not set(WORKER_SECRETS) & set(environ), set(WORKER_SECRETS) & set(environ)
    assert "PATH" in environ and environ["SLOTSERVE_RUN_ID"] == runtime.run_id

    # Nowhere a user can read it: the run log, the channel API, the metrics.
    api = APIClient()
    api.force_authenticate(ana)
    log_lines = api.get(f"/api/channels/{channel.pk}/log", {"lines": 5000}).data["lines"]
    assert log_lines and secret not in "\n".join(log_lines)
    assert secret not in Path(runtime.log_path).read_text()
    assert secret not in api.get(f"/api/channels/{channel.pk}/").content.decode()
    assert secret not in api.get("/api/channels/").content.decode()
    assert secret not in api.get("/metrics").content.decode()
    # Should a backend ever print its key, the log is shown with it redacted.
    with Path(runtime.log_path).open("a") as log:
        log.write(f"main: api key {secret} set\n")
    shown: list[str] = []

    def shipped() -> bool:  # the node worker ships new lines as they are written
        shown[:] = api.get(f"/api/channels/{channel.pk}/log", {"lines": 5}).data["lines"]
        return "main: api key [redacted] set" in shown

    assert eventually(shipped, timeout=5, every=0.05)
    assert "main: api key [redacted] set" in shown
    assert not any(secret in line for line in shown)
    staff = factories.user("boss", staff=True)
    api.force_authenticate(staff)
    whole = b"".join(api.get(f"/api/channels/{channel.pk}/log", {"full": 1}).streaming_content)  # type: ignore[attr-defined]
    assert secret.encode() not in whole and b"[redacted]" in whole
    from django.test import Client

    portal = Client()
    portal.force_login(ana)
    assert secret not in portal.get(f"/channel/{channel.pk}/log").content.decode()


def test_files_of_a_run_are_private(node_env, tiny):
    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    runtime = converge(channel, until={Phase.READY})
    log_path = Path(runtime.log_path)
    assert stat.S_IMODE(log_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(log_path.parent.stat().st_mode) == 0o700


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_the_standin_for_vllm_and_sglang_gets_its_secret_without_the_command_line(node_env, backend):
    model = factories.llm("hf", backend=backend, path=str(Path(__file__)))
    # Abbreviations of owned options: argparse (which the stand-in uses, like vLLM and SGLang)
    # would read "--hos 0.0.0.0" as "--host 0.0.0.0" and "--api-k" as "--api-key".
    preset = factories.preset(model, "sneaky", "--hos 0.0.0.0 --api-k known --standin-load-seconds 0")
    channel = factories.channel("gpu-0", default=preset)
    decide_channels(now=timezone.now())
    runtime = converge(channel, until={Phase.READY})
    log = Path(runtime.log_path).read_text()
    assert f"listening on 127.0.0.1:{runtime.port}" in log, log
    command = log.splitlines()[0].split()
    assert "--hos" not in command and "--api-k" not in command and "known" not in command
    assert _chat(runtime.port, None).status_code == 401
    assert _chat(runtime.port, "known").status_code == 401
    assert _chat(runtime.port, runtime.api_secret).status_code == 200
    assert runtime.api_secret.encode() not in Path(f"/proc/{runtime.pid}/cmdline").read_bytes()
    if backend == "sglang":
        config = next(Path(runtime.log_path).parent.glob("*.config.yaml"))
        assert stat.S_IMODE(config.stat().st_mode) == 0o600


def test_child_environment_is_an_allowlist():
    parent = {
        "PATH": "/usr/bin",
        "HOME": "/home/x",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "HF_HOME": "/cache/hf",
        "CUDA_HOME": "/usr/local/cuda",
        "NCCL_DEBUG": "INFO",
        "MY_BACKEND_FLAG": "1",
        **WORKER_SECRETS,
        "VLLM_API_KEY": "inherited",
        "SLOTSERVE_RUN_ID": "old",
    }
    env = processes.child_environment(parent, extra_names=["MY_BACKEND_FLAG"], own={"VLLM_API_KEY": "own"})
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/home/x",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "HF_HOME": "/cache/hf",
        "CUDA_HOME": "/usr/local/cuda",
        "NCCL_DEBUG": "INFO",
        "MY_BACKEND_FLAG": "1",
        "VLLM_API_KEY": "own",
    }


def test_redact_hides_the_secret_and_any_api_key_option():
    text = "$ llama-server --api-key abc --port 1\nkey s3cr3t-value used"
    assert processes.redact(text, "s3cr3t-value") == (
        "$ llama-server --api-key [redacted] --port 1\nkey [redacted] used"
    )


def test_gateway_sends_the_secret_upstream(node_env, tiny, ana):
    """The snapshot hands the run's secret to the gateway, and only there."""
    from gateway.admit.snapshot import read_snapshot

    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    runtime = converge(channel, until={Phase.READY})
    view = next(c for c in read_snapshot().channels if c.id == channel.pk)
    assert view.upstream_key == runtime.api_secret
    assert runtime.api_secret not in repr(view)
    assert ChannelRuntime.objects.get(channel=channel).api_secret == runtime.api_secret
