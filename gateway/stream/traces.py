"""A trace per gateway request (docs/metrics.md, "Traces"), made when the request ends from the
moments its ``Answer`` kept: no span is open while a request runs, and with traces off this
module is not imported (``Answer.record`` checks one global).

The request's span (``gateway <method> <path>``) holds: ``admission`` (from its arrival until the
gateway decided where it goes and whether it may), ``queue wait`` (its wait for a place, within
admission), ``upstream connect`` (until the request was on its way to the process) and
``upstream`` (until the answer's end), with the ``first token`` as an event. Attributes: the
channel, the model asked for and the one that served, the status, the outcome (``ok`` or the
refusal's code), the tokens and the request id. No prompt or answer text.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from gateway.stream import answer as answers

if TYPE_CHECKING:
    from gateway.stream.answer import Answer
    from gateway.stream.events import Usage

tracer = trace.get_tracer("slotserve.gateway")


def turn_on() -> None:
    """Every request from now on is told as a trace."""
    answers.TRACE = told


def told(answer: Answer, usage: Usage | None, request_id: str) -> None:
    ended = time.perf_counter()

    def ns(moment: float) -> int:  # a perf_counter() moment of this request, as wall-clock ns
        return int((answer.arrived + (moment - answer.started)) * 1e9)

    attributes: dict[str, Any] = {
        "http.request.method": answer.method or "POST",
        "url.path": answer.path,
        "http.response.status_code": answer.status or 0,
        "slotserve.outcome": answer.code or ("ok" if (answer.status or 500) < 400 else "upstream_error"),
        "slotserve.request_id": request_id,
    }
    if answer.channel_id is not None:
        attributes["slotserve.channel.id"] = answer.channel_id
    if answer.model:
        attributes["gen_ai.request.model"] = answer.model
    if answer.served:
        attributes["gen_ai.response.model"] = answer.served
    if answer.caller is not None:
        attributes["enduser.id"] = str(answer.caller.user_id)
    if usage is not None:
        attributes["gen_ai.usage.input_tokens"] = usage.prompt
        attributes["gen_ai.usage.output_tokens"] = usage.completion
    root = tracer.start_span(
        f"gateway {answer.method or 'POST'} {answer.path}",
        kind=SpanKind.SERVER,
        start_time=ns(answer.started),
        attributes=attributes,
    )
    if not root.is_recording():  # not sampled (OTEL_TRACES_SAMPLER): nothing more to make
        return
    if (answer.status or 500) >= 500:
        root.set_status(Status(StatusCode.ERROR, answer.code or None))
    within = trace.set_span_in_context(root)
    _span("admission", within, ns(answer.started), ns(answer.decided))
    if answer.queued_seconds:
        _span("queue wait", within, ns(answer.decided - answer.queued_seconds), ns(answer.decided))
    if answer.connected is not None:
        _span("upstream connect", within, ns(answer.decided), ns(answer.connected))
        upstream = tracer.start_span("upstream", within, start_time=ns(answer.connected))
        if answer.first_byte is not None and not answer.code:
            upstream.add_event("first token", timestamp=ns(answer.first_byte))
        upstream.end(end_time=ns(ended))
    if answer.first_byte is not None and not answer.code:
        root.add_event("first token", timestamp=ns(answer.first_byte))
    root.end(end_time=ns(ended))


def _span(name: str, within: Any, start: int, end: int) -> None:
    tracer.start_span(name, within, start_time=start).end(end_time=max(start, end))
