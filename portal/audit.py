"""Staff's page of the audit trail, ``/audit/``, and its CSV: the trail as
``slotserve_base.audit_trail`` reads it, with the same filters as ``GET /api/audit/``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render

from slotserve_base.audit_trail import AuditFilter, row_of, trail
from slotserve_base.csv_stream import csv_response
from slotserve_base.iso import iso_moment


@staff_member_required
def audit_page(request: HttpRequest) -> HttpResponse:
    found = AuditFilter(request.GET, queryset=trail())
    rows = [row_of(entry) for entry in found.qs[:200]] if found.is_valid() else []
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


@staff_member_required
def audit_csv(request: HttpRequest) -> HttpResponseBase:
    found = AuditFilter(request.GET, queryset=trail())
    if not found.is_valid():
        return HttpResponse(str(found.errors), status=400, content_type="text/plain")

    def lines() -> Iterator[list[Any]]:
        for entry in found.qs.iterator(chunk_size=1000):
            row = row_of(entry)
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


def _pairs(changes: dict[str, Any]) -> Iterator[tuple[str, tuple[Any, Any]]]:
    for name, change in changes.items():
        if isinstance(change, list) and len(change) == 2:
            yield name, (change[0], change[1])
        else:  # a many-to-many change: {"type": "add", "objects": [...]}
            yield name, ("", str(change))
