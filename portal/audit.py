"""Staff's page of the audit trail, ``/audit/``, and its CSV: the trail as
``slotserve_base.audit_trail`` reads it, with the same filters as ``GET /api/audit/``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from auditlog.models import LogEntry
from django.conf import settings
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render
from django.utils import timezone

from portal.actions import staff_only
from slotserve_base.audit_trail import AuditFilter, rows_of, trail
from slotserve_base.csv_stream import csv_response
from slotserve_base.iso import iso_moment


@staff_only("The audit trail")
def audit_page(request: HttpRequest) -> HttpResponse:
    found = AuditFilter(request.GET, queryset=trail())
    rows = rows_of(found.qs[:200]) if found.is_valid() else []
    return render(
        request,
        "portal/audit.html",
        {
            "rows": rows,
            "errors": found.errors,
            "filters": request.GET,
            "query": request.GET.urlencode(),
            "retention_days": settings.SLOTSERVE_AUDIT_DAYS,
        },
    )


CSV_FIELDS = ["at", "who", "email", "via", "key", "action", "what", "object", "changes"]


@staff_only("The audit trail")
def audit_csv(request: HttpRequest) -> HttpResponseBase:
    found = AuditFilter(request.GET, queryset=trail())
    if not found.is_valid():
        return HttpResponse(str(found.errors), status=400, content_type="text/plain")

    # Written after the view returns (a stream), in the reader's zone still.
    zone = timezone.get_current_timezone()

    def lines() -> Iterator[list[Any]]:
        with timezone.override(zone):
            yield from rows()

    def rows() -> Iterator[list[Any]]:
        for row in _each_row(found.qs):
            changes = "; ".join(f"{name}: {old} → {new}" for name, (old, new) in _pairs(row["shown"]))
            yield [
                iso_moment(row["at"]),
                row["who"],
                row["email"],
                row["via"],
                row["key"],
                row["action"],
                row["what"],
                row["object"],
                changes,
            ]

    return csv_response(request, CSV_FIELDS, lines(), "slotserve-audit.csv")


def _each_row(entries: QuerySet[LogEntry], chunk: int = 1000) -> Iterator[dict[str, Any]]:
    """Every entry as people read it, a thousand at a time, their related objects' words read
    once per thousand."""
    batch: list[LogEntry] = []
    for entry in entries.iterator(chunk_size=chunk):
        batch.append(entry)
        if len(batch) == chunk:
            yield from rows_of(batch)
            batch = []
    yield from rows_of(batch)


def _pairs(changes: dict[str, Any]) -> Iterator[tuple[str, tuple[Any, Any]]]:
    for name, change in changes.items():
        if isinstance(change, list) and len(change) == 2:
            yield name, (change[0], change[1])
        else:  # a many-to-many change: {"type": "add", "objects": [...]}
            yield name, ("", str(change))
