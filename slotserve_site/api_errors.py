"""Every REST API error answers JSON with a human message (docs/api.md).

DRF's default bodies are kept (``{"field": ["..."]}`` for validation errors)
and a top-level ``message`` is added that names the field and the rule, so a
script can print one line and a person knows what to fix.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import ProtectedError, RestrictedError
from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from slotserve_base.iso import iso_moment


def _first_message(detail: Any, path: str = "") -> str:
    if isinstance(detail, dict):
        for key, value in detail.items():
            if key in {"message", "code"}:
                continue
            name = key if key != "non_field_errors" else ""
            return _first_message(value, f"{path}.{name}".strip(".") if name else path)
        return ""
    if isinstance(detail, list) and detail:
        return _first_message(detail[0], path)
    text = str(detail)
    return f"{path}: {text}" if path else text


def _service_error(exc: Exception) -> Response | None:
    """Errors raised by the services, answered with the rule that refused."""
    from reservations.services import InvalidTransition, ReservationConflict, SeriesConflict
    from slotserve_base.errors import InUse, InvalidInput, OutsideScope, TooManyTries

    if isinstance(exc, InvalidInput):
        return Response({"message": f"{exc.field}: {exc.message}", exc.field: [exc.message]}, status=400)
    if isinstance(exc, ReservationConflict):
        body: dict[str, Any] = {"message": exc.message, "code": "reservation_conflict"}
        if exc.conflicting is not None:
            body["conflict"] = {
                "id": exc.conflicting.pk,
                "start": iso_moment(exc.conflicting.start),
                "end": iso_moment(exc.conflicting.end),
                "status": exc.conflicting.status,
            }
        return Response(body, status=409)
    if isinstance(exc, SeriesConflict):
        conflicts = [
            {"start": iso_moment(s), "end": iso_moment(e), "reason": why} for s, e, why in exc.problems
        ]
        return Response(
            {"message": exc.message, "code": "series_conflict", "conflicts": conflicts}, status=409
        )
    if isinstance(exc, InUse):
        return Response({"message": exc.message, "code": "in_use"}, status=409)
    if isinstance(exc, OutsideScope):
        return Response({"message": exc.message, "code": "key_scope"}, status=403)
    if isinstance(exc, TooManyTries):
        return Response(
            {"message": exc.message, "code": "too_many_tries"},
            status=429,
            headers={"Retry-After": str(exc.retry_after)},
        )
    if isinstance(exc, InvalidTransition):
        return Response({"message": exc.message, "code": "invalid_transition"}, status=409)
    return None


def _still_referenced(exc: ProtectedError | RestrictedError) -> Response:
    """A delete refused because other rows point at the object: 409 naming them."""
    objects = list(exc.protected_objects if isinstance(exc, ProtectedError) else exc.restricted_objects)
    named = [f"{obj._meta.verbose_name} {obj}" for obj in objects[:5]]
    more = f" and {len(objects) - 5} more" if len(objects) > 5 else ""
    message = f"cannot delete it: {', '.join(named)}{more} still refer to it; remove or change those first"
    return Response({"message": message, "code": "still_referenced"}, status=409)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    handled = _service_error(exc)
    if handled is not None:
        return handled
    if isinstance(exc, ProtectedError | RestrictedError):
        return _still_referenced(exc)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    data = response.data
    if isinstance(data, dict) and "message" not in data:
        data = {"message": _first_message(data), **data}
    elif isinstance(data, list):
        data = {"message": _first_message(data), "errors": data}
    response.data = data
    return response


class JsonWhateverIsAccepted(DefaultContentNegotiation):
    """A browser's ``Accept: text/html`` still gets the JSON answer, not ``406 Not Acceptable``."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        offered = list(renderers)
        try:
            chosen: tuple[BaseRenderer, str] = super().select_renderer(request, offered, format_suffix)
            return chosen
        except NotAcceptable:
            return offered[0], offered[0].media_type
