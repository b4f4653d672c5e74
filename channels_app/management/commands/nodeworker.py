"""``manage.py nodeworker``: this machine's node worker.

Registers the node and its GPUs, adopts or stops the processes an earlier
worker left, then consumes the node's own queue (``node.<name>``). Stopping
it stops no inference process: they keep serving until the scheduler asks.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from celery import current_app as app  # the project's app (slotserve_site.celery)
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from channels_app.models import Channel
from channels_app.node_worker import heartbeat, ports, registration, worker
from slotserve_base.dispatch import node_queue


class Command(BaseCommand):
    help = "Run the node worker of this machine (SLOTSERVE_NODE_NAME, default the host name)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", default=settings.SLOTSERVE_NODE_NAME)
        parser.add_argument("--concurrency", type=int, default=4)

    def handle(self, *args: Any, **options: Any) -> None:
        os.umask(0o077)  # run logs and SGLang's secret file: the worker's user's only
        name = options["name"]
        now = timezone.now()
        try:
            registration.claim(node_name=name, machine=registration.this_machine(), now=now)
        except registration.NodeNameTaken as taken:
            raise CommandError(str(taken)) from None
        node = registration.heartbeat(node_name=name, now=now)
        process_ports = settings.SLOTSERVE_PROCESS_PORTS
        where = (
            f"ports {process_ports.start}-{process_ports.stop - 1}"
            if process_ports
            else "ports the kernel picks"
        )
        self.stdout.write(
            f"node {name}: {node.gpus.count()} GPU(s); queue {node_queue(name)}; processes on {where}"
        )
        if warning := ports.port_range_warning(process_ports, ports.ephemeral_ports()):
            self.stderr.write(f"warning: {warning}")
        for channel_id in Channel.objects.filter(node=node).values_list("pk", flat=True):
            worker.reconcile(channel_id=channel_id, now=timezone.now())
        # The node's own pulse, independent of the scheduler (channels_app.node_worker.heartbeat).
        heartbeat.start(name)
        # Threads, not forks: the worker must be the parent of the processes it
        # starts, to see their exit codes and reap them.
        app.Worker(
            queues=[node_queue(name)],
            pool="threads",
            concurrency=options["concurrency"],
            hostname=f"node-{name}@{socket.gethostname()}",
            loglevel=settings.SLOTSERVE_LOG_LEVEL,
            without_mingle=True,
            without_gossip=True,
            quiet=True,  # no banner: the node says what it needs itself (queue, ports, GPUs)
        ).start()
