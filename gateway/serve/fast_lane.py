"""The gateway's fast lane: requests that can go upstream at once, carried by callbacks.

Most requests need nothing but their channel: a known key, a model ready on one channel, no
wish to wait, and room under the caller's limits if it has any. The gateway's server
(``gateway.serve.server``) gives each such request, its body read, to ``take``; from there it is
carried by the callbacks of the client's connection, of the upstream connection and of Redis'
reply to its count in, with no task and no ASGI messages. Carried so, the gateway's design costs
what a byte relay costs (``bench/gateway_bench.py``), and its CPU goes to its work.

Each request taken is an ``Exchange`` (``gateway.serve.exchange``). Everything else is the ASGI
application's (``gateway.serve.proxy``), and the lane answers as it does: the same admission
step from the same inputs (``gateway.admit.step``; the lane carries the request only when the
step says ``GoNow`` on a channel whose slot does not lend), count in and out, refusals, headers,
stream, usage and log record, by the same functions. ``take`` declines the rest (another
origin's request, every other action of the step); the application then serves it from the
start.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from django.utils import timezone

from gateway.admit.admission import Entry
from gateway.admit.places import takes_place
from gateway.admit.request import (
    ROOT_PATHS,
    asked,
    authenticate,
    header,
    is_admin_endpoint,
    path_problem,
)
from gateway.admit.step import Admission, GoNow, step
from gateway.rules.access import Refusal
from gateway.serve.admitting import seen, take_room
from gateway.serve.exchange import Exchange
from gateway.serve.proxy import Gateway
from gateway.stream.answer import Answer
from gateway.stream.events import Usage
from gateway.stream.outgoing import Outgoing
from gateway.stream.tenancy import Flight

if TYPE_CHECKING:
    from gateway.serve.http_cycle import Cycle


def take(gateway: Gateway, cycle: Cycle, raw: bytes) -> bool:
    """Carry ``cycle``'s request (``raw``: its whole body) in the lane, if it can go upstream at
    once; False leaves it to the ASGI application, untouched."""
    scope = cycle.scope
    path = scope["path"]
    if scope["method"] != "POST" or not (path.startswith("/v1/") or path in ROOT_PATHS):
        return False
    if path_problem(path) is not None or is_admin_endpoint("POST", path):
        return False  # refused by the application
    if gateway.cors.enabled and header(scope, b"origin"):
        return False
    snapshot = gateway.snapshots.fresh()
    if snapshot is None:
        return False
    caller = authenticate(scope, snapshot)
    if caller is None:
        return False  # refused by the application
    # The same stages as the application's, in the same order, to the same first admission
    # step; where the application would refuse, hold, wait a turn, count in first or weigh
    # channels by their requests in flight, the lane declines.
    request = asked(
        scope,
        raw,
        caller,
        snapshot,
        pinned=None,
        path=path,
        max_body=gateway.max_body,
        max_wait=gateway.max_wait,
    )
    if isinstance(request, Refusal):
        return False
    now = timezone.now()
    if caller.expired(now):
        return False  # the application tells it so
    deadline = time.monotonic() + request.wait
    admission = Admission(caller, request.model, None, takes_place("POST", path), deadline)
    _, action = step(admission, seen(gateway, snapshot), now)
    # A lent slot's requests are the application's: borrowed ones may be ended by the booker's.
    if not isinstance(action, GoNow) or action.lends:
        return False
    go = action.go
    channel = go.channel
    if channel.upstream is None:
        return False
    take_room(gateway, go, caller)
    upstream = gateway.upstream_for(channel.upstream)
    answer = Answer()
    answer.caller, answer.method, answer.path, answer.model = caller, "POST", path, request.named
    answer.goes_to(channel)
    outgoing = Outgoing.of(request, "POST", scope.get("query_string", b""))
    target, headers, content, streaming, strip_usage = outgoing.to(channel, upstream)
    exchange = Exchange(
        gateway, cycle, upstream, channel, caller, answer, streaming, strip_usage, Usage.asking(request.body)
    )
    exchange.request = upstream.request_bytes(b"POST", target, headers, content)
    # Watched for a slot's edge while it is in flight (``gateway.stream.tenancy``).
    exchange.flight = Flight(caller.user_id, caller.zone, answer, exchange.cut)
    gateway.tenancy.took_off(channel.id, exchange.flight)
    connection = upstream.idle_connection()
    if connection is not None:
        exchange.send(connection)
    else:
        exchange.connect()
    # Counted in while the process works (its request left first, so the first token waits for
    # one write fewer); nothing comes back before the count in: the process's answer waits for it.
    entry = Entry.soon(gateway.counters, go, caller, now)
    exchange.why = entry.why
    assert entry.pending is not None
    entry.pending.add_done_callback(exchange.entered)
    return True
