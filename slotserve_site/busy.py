"""The answer when SlotServe cannot take a request now but can soon: ``503`` with ``Retry-After``,
not a 500.

On PostgreSQL each process takes its connections from a pool (docs/deploy.md, "Database
connections"); when every connection is busy for longer than ``SLOTSERVE_DB_POOL_TIMEOUT``, the
request cannot be served now but can be soon. So when the database went away under the request
(a restart ends every connection; SQLite's lock not had in time): whatever the request was doing
in its transaction was rolled back. Django's error handler
(``handler500``) sees the exception being handled and answers 503, in JSON under ``/api/``
(``{"message": …, "code": …}``) and as a short page elsewhere; anything else is the usual 500.
"""

from __future__ import annotations

import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import server_error as django_server_error

RETRY_AFTER_SECONDS = 5
BUSY = "SlotServe is busy right now (every database connection is in use); try again in a few seconds"
UNAVAILABLE = (
    "SlotServe lost its database connection while answering (the database may be restarting); "
    "the change it was making then was not kept: look, then try again in a few seconds"
)


def pool_exhausted(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what it was raised from) is the pool's "no connection in time"."""
    while exc is not None:
        if type(exc).__name__ == "PoolTimeout" and type(exc).__module__.startswith("psycopg_pool"):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def database_lost(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the database going away under a request (its connection ended, or
    not to be had): Django's ``OperationalError`` or ``InterfaceError``."""
    return isinstance(exc, (OperationalError, InterfaceError))


def server_error(request: HttpRequest) -> HttpResponse:
    failure = sys.exc_info()[1]
    if pool_exhausted(failure):
        message, code = BUSY, "busy"
    elif database_lost(failure):
        message, code = UNAVAILABLE, "database_unavailable"
    else:
        return django_server_error(request)
    answer: HttpResponse
    if request.path.startswith("/api/"):
        answer = JsonResponse({"message": message, "code": code}, status=503)
    else:
        answer = HttpResponse(f"<!doctype html><title>Unavailable</title><p>{message}.</p>", status=503)
    answer["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return answer
