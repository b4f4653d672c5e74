"""The Celery application: beat runs the scheduler tick, node workers manage processes."""

import logging
import os
from typing import Any

from celery import Celery
from celery.signals import after_setup_logger, worker_process_init, worker_process_shutdown

from slotserve_base import tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "slotserve_site.settings")

app = Celery("slotserve")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# The stages of channels_app keep their tasks in their own packages.
app.autodiscover_tasks(["channels_app.scheduling", "channels_app.node_worker"])

# Celery's lines for each task run: received, succeeded, and beat's "Sending due task".
ROUTINE_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace", "celery.beat")


@after_setup_logger.connect
def quiet_routine_task_lines(loglevel: int | str = logging.INFO, **_: Any) -> None:
    """The tick, the node's tick and the usage flush run every few seconds: a line for each run
    would bury what happens. Those lines show at DEBUG; a task that fails is logged as an error
    whatever the level."""
    if isinstance(loglevel, str):
        loglevel = logging.getLevelName(loglevel.upper())
    if isinstance(loglevel, int) and loglevel > logging.DEBUG:
        for name in ROUTINE_TASK_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


@worker_process_init.connect
def trace_tasks(**_: Any) -> None:
    """Each task run a span, where OTEL_EXPORTER_OTLP_ENDPOINT asks for traces (docs/metrics.md)."""
    tracing.start_worker()


@worker_process_shutdown.connect
def send_last_spans(**_: Any) -> None:
    tracing.flush()
