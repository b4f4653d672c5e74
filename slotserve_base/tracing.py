"""Traces, if a lab wants them (docs/metrics.md, "Traces"): OpenTelemetry's SDK, started only when
the standard variables ask for it (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), exporting over OTLP/HTTP. Without them nothing of
OpenTelemetry is imported, and the gateway's hot path has one check of a module global.

``start_web`` traces the web process (Django's requests; the gateway's requests are told by
``gateway.stream.traces`` from the moments each request kept); ``start_worker`` traces a Celery
process's tasks (decisions, reconciles, webhook deliveries…).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

_started = False


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces, as OpenTelemetry's variables say."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


def start(service: str) -> bool:
    """Start the SDK once in this process if the environment asks for traces; whether it runs.
    ``service``: the ``service.name`` unless ``OTEL_SERVICE_NAME`` gives one."""
    global _started
    if _started:
        return True
    if not wanted():
        return False
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    )
    if protocol.strip() != "http/protobuf":
        log.warning("traces: OTLP over %r is not supported; SlotServe exports over http/protobuf", protocol)
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "traces: OTEL_EXPORTER_OTLP_ENDPOINT is set, but OpenTelemetry's SDK is not installed "
            "(pip install 'slotserve[traces]'): no traces are sent"
        )
        return False
    name = os.environ.get("OTEL_SERVICE_NAME", "").strip() or service
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _started = True
    log.info("traces: exporting as %s over OTLP/HTTP", name)
    return True


def start_web() -> bool:
    """Trace the web process: Django's requests (before Django loads its middleware), and the
    gateway's."""
    if not start("slotserve"):
        return False
    from opentelemetry.instrumentation.django import DjangoInstrumentor

    DjangoInstrumentor().instrument(request_hook=scrub)
    return True


# Paths that carry a secret (docs/metrics.md, "Traces"): the calendar feed's token, a
# password-reset link's token. Their secret part is told as "…" in every exported attribute.
SECRET_PATHS = [
    (re.compile(r"^(/calendar/)[^/]+(\.ics)$"), r"\1…\2"),
    (re.compile(r"^(/accounts/reset/[^/]+/)(?!set-password/$)[^/]+(/)$"), r"\1…\2"),
]
# The span attributes that hold a request's path or its URL (old and new semantic conventions).
PATH_ATTRIBUTES = ("http.target", "url.path")
URL_ATTRIBUTES = ("http.url", "url.full")


def scrubbed(path: str) -> str:
    """``path`` as a trace may keep it: its secret part told as "…", no query string (a sign-in's
    code, a token passed as a parameter)."""
    path = path.split("?", 1)[0]
    for pattern, replacement in SECRET_PATHS:
        path = pattern.sub(replacement, path)
    return path


def scrub(span: Any, request: Any) -> None:
    """The Django instrumentation's ``request_hook``: the request's span keeps its path scrubbed
    (``scrubbed``) in every attribute that held it, before anything is exported."""
    if not span.is_recording():
        return
    path = scrubbed(request.path)
    attributes = getattr(span, "attributes", None) or {}
    for name in PATH_ATTRIBUTES:
        if name in attributes:
            span.set_attribute(name, path)
    for name in URL_ATTRIBUTES:
        if name in attributes:
            host = str(request.META.get("HTTP_HOST") or request.META.get("SERVER_NAME", ""))
            span.set_attribute(name, f"{request.scheme}://{host}{path}")
    if "url.query" in attributes:
        span.set_attribute("url.query", "")


def start_worker() -> bool:
    """Trace a Celery process's tasks (called in each worker process: the SDK's exporting thread
    does not outlive a fork)."""
    if not start("slotserve-worker"):
        return False
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    CeleryInstrumentor().instrument()  # type: ignore[no-untyped-call]
    return True


def flush(timeout_ms: int = 5000) -> None:
    """Send what is kept now (a process about to end)."""
    if not _started:
        return
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        force_flush(timeout_ms)
