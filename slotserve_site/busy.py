"""The answer when SlotServe is too busy to take a request: ``503`` with ``Retry-After``, not a 500.

On PostgreSQL each process takes its connections from a pool (docs/deploy.md, "Database
connections"); when every connection is busy for longer than ``SLOTSERVE_DB_POOL_TIMEOUT``, the
request cannot be served now but can be soon. Django's error handler (``handler500``) sees the
exception being handled: a pool that had no connection to give answers 503, in JSON under
``/api/`` (``{"message": …}``) and as a short page elsewhere; anything else is the usual 500.
"""

from __future__ import annotations

import sys

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import server_error as django_server_error

RETRY_AFTER_SECONDS = 5
BUSY = "SlotServe is busy right now (every database connection is in use); try again in a few seconds"


def pool_exhausted(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what it was raised from) is the pool's "no connection in time"."""
    while exc is not None:
        if type(exc).__name__ == "PoolTimeout" and type(exc).__module__.startswith("psycopg_pool"):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def server_error(request: HttpRequest) -> HttpResponse:
    if not pool_exhausted(sys.exc_info()[1]):
        return django_server_error(request)
    answer: HttpResponse
    if request.path.startswith("/api/"):
        answer = JsonResponse({"message": BUSY, "code": "busy"}, status=503)
    else:
        answer = HttpResponse(f"<!doctype html><title>Busy</title><p>{BUSY}.</p>", status=503)
    answer["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return answer
