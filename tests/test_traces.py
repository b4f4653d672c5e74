"""Traces, if a lab wants them (docs/metrics.md, "Traces"): with OpenTelemetry's standard variables
set, a trace per gateway request (its stages as spans, no prompt text), per web request and per
Celery task reaches a local OTLP receiver; without them, nothing of OpenTelemetry is loaded."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.conf import settings as django_settings

from slotserve_base.tracing import wanted
from tests.clock import eventually
from tests.conftest import free_port
from tests.otlp_receiver import OtlpReceiver

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "a secret plan for the lab's retreat"


def test_the_standard_variables_turn_traces_on_and_off():
    assert not wanted({})
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"})
    assert not wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}
    )


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "DATABASE_URL"}
    env.update(
        SLOTSERVE_DATA_DIR=str(tmp_path),
        SLOTSERVE_REDIS_URL=django_settings.REDIS_URL,
        SLOTSERVE_REDIS_PREFIX=f"slotserve-test-{uuid.uuid4().hex[:12]}",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def test_without_the_variables_nothing_is_traced(tmp_path):
    """No tracer provider is set, Django's middleware and Celery's signals are as they were, and the
    gateway's hook is empty. (redis-py imports OpenTelemetry's SDK where it is installed, for its
    own metrics it never starts unasked; that import is not SlotServe's.)"""
    probe = (
        "import slotserve_site.asgi, slotserve_site.celery\n"
        "from django.conf import settings\n"
        "from gateway.stream import answer\n"
        "from slotserve_base import tracing\n"
        "from opentelemetry import trace\n"
        "print(type(trace.get_tracer_provider()).__name__, tracing._started, answer.TRACE,\n"
        "      [m for m in settings.MIDDLEWARE if 'opentelemetry' in m])\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "ProxyTracerProvider False None []"
    # With the variables, the same probe finds each set.
    traced = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env=_env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert traced.returncode == 0, traced.stderr
    said = traced.stdout.strip()
    assert said.startswith("TracerProvider True <function told at ")
    assert said.endswith(
        "['opentelemetry.instrumentation.django.middleware.otel_middleware._DjangoMiddleware']"
    )


@pytest.fixture
def spans_to_receiver(monkeypatch):
    """The gateway's traces, made in this process and exported over OTLP/HTTP to a local receiver
    (a provider of the test's own: the process's global one is left alone)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from gateway.stream import answer, traces

    with OtlpReceiver() as receiver:
        provider = TracerProvider(resource=Resource.create({"service.name": "slotserve"}))
        provider.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces"))
        )
        monkeypatch.setattr(traces, "tracer", provider.get_tracer("slotserve.gateway"))
        monkeypatch.setattr(answer, "TRACE", traces.told)
        yield receiver
        provider.shutdown()


def test_a_gateway_request_is_a_trace_of_its_stages_without_its_prompt(gateway_url, world, spans_to_receiver):
    served = httpx.post(
        f"{gateway_url}/v1/chat/completions",
        json={"model": "qwen", "messages": [{"role": "user", "content": PROMPT}], "stream": True},
        headers={"Authorization": f"Bearer {world.ana_key}"},
        timeout=30,
    )
    assert served.status_code == 200
    unknown = httpx.post(
        f"{gateway_url}/v1/chat/completions",
        json={"model": "nobody-runs-this", "messages": [{"role": "user", "content": PROMPT}]},
        headers={"Authorization": f"Bearer {world.bo_key}"},
        timeout=30,
    )
    assert unknown.status_code == 404
    name = "gateway POST /v1/chat/completions"
    assert eventually(lambda: len(spans_to_receiver.named(name)) == 2, timeout=10)
    ok, refused = sorted(spans_to_receiver.named(name), key=lambda s: s.start_ns)
    assert ok.attributes["slotserve.outcome"] == "ok" and ok.attributes["http.response.status_code"] == 200
    assert ok.attributes["slotserve.channel.id"] == world.channel.pk
    assert ok.attributes["gen_ai.request.model"] == ok.attributes["gen_ai.response.model"] == "qwen"
    assert ok.attributes["gen_ai.usage.output_tokens"] > 0
    assert "first token" in ok.events and ok.start_ns < ok.events["first token"] <= ok.end_ns
    stages = {s.name: s for s in spans_to_receiver.spans if s.trace_id == ok.trace_id and s is not ok}
    assert set(stages) == {"admission", "upstream connect", "upstream"}, stages
    assert all(s.parent_id == ok.span_id for s in stages.values())
    assert ok.start_ns == stages["admission"].start_ns <= stages["admission"].end_ns
    assert stages["upstream connect"].end_ns == stages["upstream"].start_ns
    assert stages["upstream"].end_ns == ok.end_ns and "first token" in stages["upstream"].events
    assert refused.attributes["slotserve.outcome"] == "model_not_loaded"
    assert refused.attributes["http.response.status_code"] == 404 and "first token" not in refused.events
    assert all(PROMPT.encode() not in body for body in spans_to_receiver.bodies)


@contextlib.contextmanager
def traced_site(
    tmp_path: Path, *, worker: bool = False
) -> Iterator[tuple[OtlpReceiver, str, dict[str, str]]]:
    """SlotServe's web process (and a Celery worker) with traces on, exporting to a local OTLP
    receiver: the receiver, the site's URL once its sign-in page answers, and the environment."""
    with OtlpReceiver() as receiver:
        env = _env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="100")
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        port = free_port()
        commands = {
            "web": [sys.executable, "-m", "uvicorn", "slotserve_site.asgi:application", "--port", str(port)]
        }
        if worker:
            commands["worker"] = [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "slotserve_site",
                "worker",
                "--concurrency",
                "1",
            ]
        started = []
        try:
            for name, command in commands.items():
                log = (tmp_path / f"{name}.log").open("w")
                started.append(
                    subprocess.Popen(
                        command,
                        cwd=ROOT,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            url = f"http://127.0.0.1:{port}"

            def page() -> bool:
                try:
                    return httpx.get(f"{url}/accounts/login/", timeout=5).status_code == 200
                except httpx.HTTPError:
                    return False

            assert eventually(page, timeout=60, every=0.3), (tmp_path / "web.log").read_text()[-2000:]
            yield receiver, url, env
        finally:
            for child in started:
                os.killpg(child.pid, signal.SIGTERM)
            for child in started:
                child.wait(timeout=30)


def test_web_requests_and_tasks_are_traced_when_the_variables_ask(tmp_path):
    with traced_site(tmp_path, worker=True) as (receiver, _, env):
        sent = "from slotserve_base import dispatch; dispatch.send(dispatch.AUDIT_FORGET)"
        subprocess.run(
            [sys.executable, "-c", f"import django; django.setup(); {sent}"],
            cwd=ROOT,
            env={**env, "DJANGO_SETTINGS_MODULE": "slotserve_site.settings"},
            check=True,
        )

        def traced() -> bool:
            services = {(s.service, s.name) for s in receiver.spans}
            return ("slotserve", "GET accounts/login/") in services and any(
                service == "slotserve-worker" and "forget_old_audit" in name for service, name in services
            )

        assert eventually(traced, timeout=60, every=0.3), (
            sorted({(s.service, s.name) for s in receiver.spans}),
            (tmp_path / "worker.log").read_text()[-2000:],
        )


def test_no_trace_carries_a_secret_of_a_path_or_a_query(tmp_path):
    """The calendar feed's token and a password-reset link's token travel in their paths, a
    sign-in's code in a query string: the web process's spans carry none of them, scrubbed
    before they are exported."""
    feed, reset, code = (
        "feedtoken" + uuid.uuid4().hex,
        "resettoken-" + uuid.uuid4().hex[:20],
        uuid.uuid4().hex,
    )
    with traced_site(tmp_path) as (receiver, url, _):
        asked = [f"/calendar/{feed}.ics", f"/accounts/reset/MQ/{reset}/", f"/accounts/login/?code={code}"]
        for path in asked:
            httpx.get(url + path, timeout=10)

        def traced() -> bool:
            return (
                sum("calendar" in s.name or "reset" in s.name or "login" in s.name for s in receiver.spans)
                >= 4
            )

        assert eventually(traced, timeout=60, every=0.3), sorted(s.name for s in receiver.spans)
        exported = b"".join(receiver.bodies)
        for secret in (feed, reset, code):
            assert secret.encode() not in exported, secret
        # What is left still says which page it was.
        targets = {str(s.attributes.get("http.target", "")) for s in receiver.spans}
        assert "/calendar/…" + ".ics" in targets and "/accounts/reset/MQ/…/" in targets, targets
