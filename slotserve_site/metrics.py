"""Prometheus metrics at ``/metrics``, read at scrape time from the database and Redis.

Reading the shared stores, rather than counting in each process, gives the
same numbers whichever web, gateway or worker process is scraped.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Count, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from redis.exceptions import RedisError

from gateway.usage.request_log import dead_letters
from gateway.wire.counter_scripts import TTFT_BUCKETS
from gateway.wire.queue_scripts import queue_stats
from slotserve_base.inflight import in_flight_counts
from slotserve_base.vocabulary import Phase, RedisKey
from slotserve_base.vocabulary import redis_key as key

PHASES = tuple(Phase.values)
GATEWAY_STATUS, GATEWAY_TTFT = RedisKey.GATEWAY_STATUS, RedisKey.GATEWAY_TTFT
log = logging.getLogger(__name__)


class SlotServeCollector:
    def collect(self) -> Iterator[Metric]:
        from channels_app.models import Channel, LoadRecord
        from reservations.models import Reservation
        from slotserve_base.redis_client import redis_client

        channels = list(Channel.objects.select_related("runtime__model", "runtime__preset"))
        phase = GaugeMetricFamily(
            "slotserve_channel_phase", "1 for the phase each channel is in", labels=["channel", "phase"]
        )
        model = GaugeMetricFamily(
            "slotserve_channel_model_info", "What each channel runs", labels=["channel", "model", "preset"]
        )
        fallback = GaugeMetricFamily(
            "slotserve_channel_fallback", "1 while the default serves a reservation", labels=["channel"]
        )
        retries = GaugeMetricFamily(
            "slotserve_channel_retry_attempts",
            "Failed attempts in a row of the current target",
            labels=["channel"],
        )
        in_flight = GaugeMetricFamily(
            "slotserve_gateway_in_flight", "Requests in flight per channel", labels=["channel"]
        )
        places = GaugeMetricFamily(
            "slotserve_channel_places",
            "Requests each channel's ready process serves at once (its fair queue's places)",
            labels=["channel"],
        )
        waiting = GaugeMetricFamily(
            "slotserve_channel_queue_waiting",
            "Requests waiting in each channel's fair queue",
            labels=["channel"],
        )
        placed = CounterMetricFamily(
            "slotserve_channel_queue_placed",
            "Requests given a place by each channel's fair queue (at once or after a wait)",
            labels=["channel"],
        )
        waited = CounterMetricFamily(
            "slotserve_channel_queue_wait_seconds",
            "Seconds the requests given a place by each channel's fair queue waited for it, in all",
            labels=["channel"],
        )
        # What only Redis knows is left out while it is away: a scrape still answers with what
        # the database knows, and says Redis is down (slotserve_redis_up 0).
        redis = redis_client()
        try:
            ids = [c.pk for c in channels]
            counts, queues = in_flight_counts(redis, ids), queue_stats(redis, ids)
            statuses_seen = redis.hgetall(key(GATEWAY_STATUS, "all"))
            ttft_seen = redis.hgetall(key(GATEWAY_TTFT, "all"))
            dead = float(redis.llen(dead_letters()))
            redis_up = True
        except RedisError as exc:
            log.warning("metrics: Redis is unreachable (%s): its figures are left out", exc)
            counts, queues, statuses_seen, ttft_seen, dead, redis_up = {}, {}, {}, {}, 0.0, False
        yield GaugeMetricFamily("slotserve_redis_up", "1 while Redis answers", value=1.0 if redis_up else 0.0)
        for channel in channels:
            runtime = channel.runtime_or_none()
            current = runtime.phase if runtime else Phase.STOPPED
            for name in PHASES:
                phase.add_metric([channel.name, name], 1.0 if name == current else 0.0)
            if runtime is not None and runtime.model is not None:
                model.add_metric(
                    [channel.name, runtime.model.name, runtime.preset.name if runtime.preset else ""], 1.0
                )
            fallback.add_metric([channel.name], 1.0 if runtime and runtime.fallback else 0.0)
            retries.add_metric([channel.name], float(runtime.attempts if runtime else 0))
            if runtime is not None and runtime.places is not None:
                places.add_metric([channel.name], float(runtime.places))
            if redis_up:
                in_flight.add_metric([channel.name], float(int(counts[channel.pk] or 0)))
                held, taken, seconds = queues[channel.pk]
                waiting.add_metric([channel.name], float(held))
                placed.add_metric([channel.name], float(taken))
                waited.add_metric([channel.name], seconds)
        yield from (phase, model, fallback, retries, in_flight, places, waiting, placed, waited)

        loads = CounterMetricFamily(
            "slotserve_loads", "Model loads by outcome", labels=["channel", "model", "outcome"]
        )
        load_seconds = CounterMetricFamily(
            "slotserve_load_seconds", "Seconds spent in successful loads", labels=["channel", "model"]
        )
        finished = LoadRecord.objects.exclude(succeeded=None).values(
            "channel__name", "model__name", "succeeded"
        )
        for row in finished.annotate(n=Count("pk")):
            outcome = "success" if row["succeeded"] else "failure"
            loads.add_metric([row["channel__name"], row["model__name"], outcome], float(row["n"]))
        for record in LoadRecord.objects.filter(succeeded=True).values(
            "channel__name", "model__name", "started", "finished"
        ):
            if record["finished"] is None:
                continue
            seconds = (record["finished"] - record["started"]).total_seconds()
            load_seconds.add_metric([record["channel__name"], record["model__name"]], seconds)
        yield from (loads, _merge(load_seconds))

        yield from _nodes_and_webhooks()
        reservations = GaugeMetricFamily(
            "slotserve_reservations", "Reservations by status", labels=["status"]
        )
        for row in Reservation.objects.values("status").annotate(n=Count("pk")):
            reservations.add_metric([row["status"]], float(row["n"]))
        yield reservations
        usage = Reservation.objects.aggregate(
            prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens")
        )
        tokens = CounterMetricFamily(
            "slotserve_reservation_tokens", "Tokens used in reservations", labels=["kind"]
        )
        tokens.add_metric(["prompt"], float(usage["prompt"] or 0))
        tokens.add_metric(["completion"], float(usage["completion"] or 0))
        yield tokens

        if not redis_up:
            return
        statuses = CounterMetricFamily(
            "slotserve_gateway_requests", "Gateway answers by status code", labels=["code"]
        )
        for code, n in sorted(statuses_seen.items()):
            statuses.add_metric([_text(code)], float(int(n)))
        yield statuses
        raw = {_text(k): float(v) for k, v in ttft_seen.items()}
        cumulative, buckets = 0.0, []
        for bound in [*map(str, TTFT_BUCKETS), "+Inf"]:
            cumulative += raw.get(bound, 0.0)
            buckets.append((bound, cumulative))
        yield GaugeMetricFamily(
            "slotserve_request_log_dead_records",
            "Request records the database would not take, set aside in Redis for a person to look at",
            value=dead,
        )
        yield HistogramMetricFamily(
            "slotserve_gateway_time_to_first_token_seconds",
            "Time from a request's arrival to its first byte from the model",
            buckets=buckets,
            sum_value=raw.get("sum", 0.0),
        )


def _nodes_and_webhooks() -> Iterator[GaugeMetricFamily]:
    """Each node's readiness and heartbeat's age (docs/node-workers.md), and the webhooks paused."""
    from channels_app.models import Node
    from reservations.webhooks.models import Webhook

    now = timezone.now()
    ready = GaugeMetricFamily("slotserve_node_ready", "1 while the node's worker heartbeats", labels=["node"])
    age = GaugeMetricFamily(
        "slotserve_node_heartbeat_age_seconds", "Seconds since the node's last heartbeat", labels=["node"]
    )
    for node in Node.objects.all():
        ready.add_metric([node.name], 1.0 if node.is_ready(now) else 0.0)
        if node.last_heartbeat is not None:
            age.add_metric([node.name], (now - node.last_heartbeat).total_seconds())
    yield from (ready, age)
    yield GaugeMetricFamily(
        "slotserve_webhooks_paused",
        "Webhooks paused (by their owner, or after failing in a row)",
        value=float(Webhook.objects.filter(paused_at__isnull=False).count()),
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _merge(family: CounterMetricFamily) -> CounterMetricFamily:
    """One sample per label set: the loads' seconds added up."""
    totals: dict[tuple[str, ...], float] = {}
    for sample in family.samples:
        labels = tuple(sample.labels.values())
        totals[labels] = totals.get(labels, 0.0) + sample.value
    merged = CounterMetricFamily(family.name, family.documentation, labels=["channel", "model"])
    for labels, value in totals.items():
        merged.add_metric(list(labels), value)
    return merged


def metrics_view(request: HttpRequest) -> HttpResponse:
    token = settings.SLOTSERVE_METRICS_TOKEN
    given = request.headers.get("Authorization", "")
    # In constant time: how long a refusal takes says nothing about how much of the token was right.
    if token and not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        return HttpResponse("metrics need Authorization: Bearer <SLOTSERVE_METRICS_TOKEN>\n", status=401)
    registry = CollectorRegistry()
    try:
        registry.register(SlotServeCollector())  # (a first collect, to learn the metrics' names)
        return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
    except DatabaseError as exc:
        log.warning("metrics: the database is unreachable: %s", exc)
        return HttpResponse("the database cannot be reached; see /health\n", status=503)
