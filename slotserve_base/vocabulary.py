"""SlotServe's words, defined once: phases, reasons, notification events, error codes and the
names of the facts shared through Redis. Models use them as ``choices``; the services, the
node worker, the gateway and the metrics use the same members (README; docs/scheduling.md).

This module imports nothing of SlotServe's: every other module may import it.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Phase(models.TextChoices):
    """Phases of a channel's inference process (docs/scheduling.md).

    stopped → loading → ready → draining → stopping → stopped;
    loading → failed (exit or load timeout); failed → loading (retry).
    """

    STOPPED = "stopped"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    FAILED = "failed"


# Phases in which a process exists and may be reached on its port.
SERVING_PHASES = (Phase.LOADING, Phase.READY, Phase.DRAINING)


class Reason(models.TextChoices):
    """Why a channel runs what it runs (docs/scheduling.md, "The decision, per channel")."""

    ACTIVE_RESERVATION = "active_reservation"
    ACTIVE_EXCLUSIVE = "active_exclusive"
    PRELOAD_NEXT = "preload_next"
    STOP_FOR_EXCLUSIVE = "stop_for_exclusive"
    SKIP_DEFAULT_SHORT_GAP = "skip_default_short_gap"
    MANUAL_OVERRIDE = "manual_override"
    MANUAL_UNLOAD = "manual_unload"
    ON_DEMAND = "on_demand"
    DEFAULT = "default"
    IDLE = "idle"
    # Chosen by the node worker, not by ``decide``: the booked model waits for
    # its next retry and the default serves the reservation meanwhile (docs/scheduling.md).
    FALLBACK_DEFAULT = "fallback_default"


class NotificationEvent(models.TextChoices):
    """The kinds of notification SlotServe sends (docs/scheduling.md)."""

    SUBMITTED = "submitted", "A booking awaits approval"
    APPROVED = "approved", "Your booking was approved"
    REJECTED = "rejected", "Your booking was rejected"
    STARTING_SOON = "starting_soon", "Your booking starts in 15 minutes"
    MODEL_READY = "model_ready", "The model of your booking is ready"
    LOAD_FAILED = "load_failed", "The model of your booking failed to load"
    FALLBACK = "fallback", "Your booking runs on the fallback model"
    RECOVERED = "recovered", "Your booking's model recovered"
    ENDED_EARLY = "ended_early", "Your booking was ended early"
    CANCELLED = "cancelled", "Your booking was cancelled"
    CHANGED = "changed", "Your booking was changed by staff"
    SLOT_FREED = "slot_freed", "A slot you wait for is free"
    IDLE_WARNING = "idle_warning", "No request has reached your booking"
    IDLE_RELEASED = "idle_released", "Your unused booking was released"
    KEY_EXPIRING = "key_expiring", "An API key of yours stops working within a week"
    WEBHOOK_PAUSED = "webhook_paused", "A webhook of yours was paused: its receiver kept failing"


class WebhookEvent(models.TextChoices):
    """What happened: the one vocabulary of happenings (``slotserve_base.happenings``), named
    ``<object>.<what happened>``. Every writer tells one happening per fact; the webhooks offer
    each of them (docs/webhooks.md), a channel's story and the notifications keep the ones they
    name (docs/architecture.md, "What happened, told once")."""

    BOOKING_REQUESTED = "booking.requested", "A booking was made (pending or approved at once)"
    BOOKING_APPROVED = "booking.approved", "A booking was approved"
    BOOKING_REJECTED = "booking.rejected", "A booking was rejected"
    BOOKING_CHANGED = "booking.changed", "A booking's time or model changed"
    BOOKING_CANCELLED = "booking.cancelled", "A booking was cancelled"
    BOOKING_STARTING_SOON = "booking.starting_soon", "A booking starts in 15 minutes"
    BOOKING_STARTED = "booking.started", "A booking's slot began"
    BOOKING_ENDED = "booking.ended", "A booking's slot ended at its time"
    BOOKING_ENDED_EARLY = "booking.ended_early", "A booking was ended before its time"
    BOOKING_RELEASED_IDLE = "booking.released_idle", "An unused booking was released"
    WAITLIST_SLOT_FREED = "waitlist.slot_freed", "A slot someone waits for is free"
    CHANNEL_LOADING = "channel.loading", "A channel began loading a model"
    CHANNEL_READY = "channel.ready", "A channel's model is ready"
    CHANNEL_FAILED = "channel.failed", "A channel's model failed to load or died"
    CHANNEL_FALLBACK = "channel.fallback", "A channel serves its default model instead of the booked one"
    CHANNEL_RECOVERED = "channel.recovered", "A channel's booked model serves again after a failure"
    CHANNEL_SWITCHED = "channel.switched", "A channel serves another model than before"
    CHANNEL_DRAINING = "channel.draining", "A channel's requests in flight finish before a switch"
    CHANNEL_STOPPING = "channel.stopping", "A channel's process was asked to stop"
    CHANNEL_STOPPED = "channel.stopped", "A channel's process has stopped"
    NODE_NOT_READY = "node.not_ready", "A node's worker stopped reporting"
    NODE_READY = "node.ready", "A node's worker reports again"
    LIMIT_REACHED = "limit.reached", "A user used up their week's token budget"
    KEY_EXPIRING = "key.expiring", "An API key stops working within a week"
    TEST = "webhook.test", "A test event, sent on request"


class ErrorCode(models.TextChoices):
    """The ``code`` of the gateway's OpenAI-shaped errors (docs/api.md, "Gateway errors")."""

    GPU_RESERVED = "gpu_reserved"
    GPU_EXCLUSIVE = "gpu_exclusive"
    MODEL_SWITCHING = "model_switching"
    MODEL_LOADING = "model_loading"
    MODEL_NOT_LOADED = "model_not_loaded"
    PREEMPTED_BY_BOOKER = "preempted_by_booker"
    INVALID_API_KEY = "invalid_api_key"
    INVALID_REQUEST = "invalid_request"
    REQUEST_TOO_LARGE = "request_too_large"
    NOT_FOUND = "not_found"
    SERVICE_UNAVAILABLE = "service_unavailable"
    UPSTREAM_UNREACHABLE = "upstream_unreachable"
    UPSTREAM_FAILED = "upstream_failed"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"  # too many requests at once or per minute
    INSUFFICIENT_QUOTA = "insufficient_quota"  # the week's token budget is used up
    TOO_MANY_HELD = "too_many_held"  # the caller has as many requests held as they may
    ADMIN_ONLY = "admin_only"  # a process's admin endpoint, through the pinned path: staff only
    KEY_EXPIRED = "key_expired"  # the API key's expiry date has passed
    KEY_SCOPE = "key_scope"  # a model or channel outside the API key's scope
    QUEUE_FULL = "queue_full"  # the caller has as many requests waiting for a channel as they may
    CHANNEL_QUEUE_FULL = "channel_queue_full"  # the channel's queue holds as many as it may
    NODE_NOT_READY = "node_not_ready"  # the channel's node worker is not reporting: nothing loads
    SLOT_BEGAN = "slot_began"  # someone else's slot began while the request ran, and it lends nothing


class RedisKey(models.TextChoices):
    """Kinds of SlotServe's Redis keys: ``<SLOTSERVE_REDIS_PREFIX>:<kind>:<id>``."""

    INFLIGHT = "inflight", "requests in flight on a channel (a sorted set of expiring entries)"
    GATE = "gate", "set while a channel switches: new requests get 503 model_switching"
    USAGE_RESERVATION = "usage:reservation", "requests and tokens of a reservation"
    USAGE_USER = "usage:user", "requests and tokens of a user"
    USAGE_KEY = "usage:key", "requests and tokens through an API key (its last use, for the key list)"
    ON_DEMAND_USED = "on_demand:used", "when a request last went to a channel's model loaded on demand"
    GATEWAY_STATUS = "metrics:gateway_status", "gateway answers by status code, for /metrics"
    GATEWAY_TTFT = "metrics:gateway_ttft", "gateway time-to-first-token histogram, for /metrics"
    GATEWAY_MARKER = "gateway", "a gateway's mark that Redis still has its in-flight entries"
    HELD = "held", "a user's requests held for a model (a sorted set of expiring entries)"
    RECONCILE = "reconcile", "the lock a node worker holds while it reconciles a channel"
    REQUEST_LOG = "requestlog", "the gateway's request records on their way to the database (a list)"
    USER_FLIGHT = "userflight", "a user's requests in flight, for their concurrency limit"
    KEY_FLIGHT = "keyflight", "an API key's requests in flight, for its concurrency limit"
    RATE = "rate", "requests started in the current minute, per user or key"
    WEEK_TOKENS = "weektokens", "a user's tokens this week (Monday 00:00 UTC on), for their budget"
    RUN_LOG = "runlog", "the last lines of a channel's run log, shipped by its node worker"
    QUEUE = "queue", "a channel's held requests by finish tag (its fair queue)"
    QUEUE_ALIVE = "queue:alive", "a channel's held requests by when they expire unless looked after"
    QUEUE_STATE = "queue:state", "a channel's fair queue: virtual time, users' tags, waits"
    QUEUE_SERVED = "queue:served", "when requests were taken from a channel's queue (last minute)"
    LENT = "lent", "a channel's borrowed requests in flight, by when they started (docs/gateway.md, Lending)"
    PREEMPTED = "preempted", "set when a booker's request ends a borrowed one, which sees it and stops"
    PREEMPTIONS = "preemptions", "the channel the borrowed requests a booker's ended are named on"
    USAGE_CATCH_UP = "usage:catchup", "set while the request log's backlog is being caught up (expires)"
    NEWS = "news", "the channel gateways hear that facts of their snapshot changed (docs/gateway.md)"
    BUDGET_TOLD = "budgettold", "set once a user's used weekly budget is told (limit.reached), for the week"


def redis_key(kind: RedisKey | str, ident: object) -> str:
    """A Redis key of this installation, e.g. ``slotserve:inflight:3``."""
    return f"{settings.SLOTSERVE_REDIS_PREFIX}:{kind}:{ident}"
