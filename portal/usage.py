"""The usage page and its CSV (docs/portal.md, "Usage"): the numbers of ``GET /api/usage/``
(``gateway.usage.api.report``), drawn. Charts are SVG drawn here by pygal: nothing loads from
elsewhere, nothing runs in the browser."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pygal
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.cache import cache
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import numberformat
from pygal.style import Style

from gateway.usage.api import report
from gateway.usage.reports import BY, NotYours
from gateway.usage.utilisation import SHARES
from slotserve_base.csv_cells import SafeWriter

COLUMNS = [
    "name",
    "booked_hours",
    "used_hours",
    "idle_booked_hours",
    "lent_hours",
    "to_come_hours",
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "ttft_ms",
    "borrowed",
]
SHARE_LABELS = {
    "switching": "switching (loading)",
    "served_booker": "serving the booker",
    "lent": "lent while the booker was idle",
    "booked_idle": "booked, unused",
    "served_default": "serving everyone (default)",
    "idle": "idle",
    "booked_to_come": "booked, still to come",
}


def _style(*colors: str) -> Style:
    return Style(
        background="transparent",
        plot_background="transparent",
        font_family="system-ui, sans-serif",
        colors=colors,
    )


# booked (passed), used, booked still to come
HOURS_STYLE = _style("#2457c5", "#1e7b45", "#9aa7c2")
# switching, serving the booker, lent, booked unused, serving everyone, idle, booked still to come
SHARES_STYLE = _style("#f0a33a", "#1e7b45", "#7fbf8f", "#b3261e", "#2457c5", "#c9ced6", "#9aa7c2")


def _svg(chart: Any) -> str:
    """The chart's SVG, without pygal's inline configuration script: the page runs no chart code."""
    svg = str(chart.render(is_unicode=True, disable_xml_declaration=True))
    return re.sub(r"<script\b.*?</script>", "", svg, flags=re.S)


# Drawing a chart costs more than counting its numbers (pygal: ~15 ms a chart). The same
# numbers draw the same chart, so a drawing is kept under its numbers for a while: colleagues
# looking at the same week, or one paging through its table, draw it once.
DRAWN_SECONDS = 600
CHART_LOOK: dict[str, Any] = {
    "js": [],
    "explicit_size": False,
    "height": 320,
    "x_label_rotation": 20,
    "legend_at_bottom": True,
    # Every series named in full, two a row under the chart (pygal cuts a legend to fit by default).
    "truncate_legend": -1,
    "legend_at_bottom_columns": 2,
}


# Each chart's kind: pygal's chart and the colours of its series.
CHARTS: dict[str, tuple[Any, Style]] = {
    "hours": (pygal.Bar, HOURS_STYLE),
    "shares": (pygal.StackedBar, SHARES_STYLE),
}


def _drawn(kind: str, title: str, labels: list[str], series: list[tuple[str, list[Any]]]) -> str:
    """The chart of ``kind`` with these bars, drawn once for the same numbers (``DRAWN_SECONDS``)."""
    numbers = repr((kind, title, labels, series)).encode()
    key = f"usage:chart:{hashlib.sha256(numbers).hexdigest()}"
    svg = cache.get(key)
    if svg is None:
        chart_class, style = CHARTS[kind]
        chart = chart_class(style=style, **CHART_LOOK)
        chart.title, chart.x_labels = title, labels
        for name, values in series:
            chart.add(name, values)
        svg = _svg(chart)
        cache.set(key, svg, DRAWN_SECONDS)
    return str(svg)


# A chart shows this many bars at most (the busiest); the table this many rows a page. A lab of a
# thousand colleagues reads neither a thousand bars nor a page of a thousand rows; the CSV has all.
CHART_BARS = 25
TABLE_PAGE = 100


def _of(shown: int, total: int) -> str:
    return f" (the {shown} busiest of {total})" if total > shown else ""


def hours_chart(rows: list[dict[str, Any]], by: str) -> str:
    busiest = sorted(
        rows, key=lambda r: (-r["booked_hours"] - r["to_come_hours"], -r["requests"], r["name"])
    )[:CHART_BARS]
    shown = sorted(busiest, key=lambda r: r["name"])
    title = f"Booked and used hours, by {by}{_of(len(shown), len(rows))}"
    labels = [r["name"] for r in shown]
    series = [
        ("booked, passed", [r["booked_hours"] for r in shown]),
        ("used by the booker's requests", [r["used_hours"] for r in shown]),
        ("booked, still to come", [r["to_come_hours"] for r in shown]),
    ]
    return _drawn("hours", title, labels, series)


def shares_chart(rows: list[dict[str, Any]]) -> str:
    busiest = sorted(rows, key=lambda r: (r["idle"], r["name"]))[:CHART_BARS]  # the least idle
    shown = sorted(busiest, key=lambda r: r["name"])
    title = f"How each channel's time went (hours){_of(len(shown), len(rows))}"
    labels = [r["name"] for r in shown]
    series = [(SHARE_LABELS[share], [r[share] for r in shown]) for share in SHARES]
    return _drawn("shares", title, labels, series)


def as_text(value: Any) -> Any:
    """A number as the template would show it (Django's localisation of ``12.5`` is "12.5" in
    SlotServe's English), written once here: a week's table by user and by channel has thousands
    of numbers, and the template's localisation of each cost a third of the page."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    text = str(value)
    return numberformat.format(value, ".") if "e" in text else text


@login_required
def usage_page(request: HttpRequest) -> HttpResponse:
    assert isinstance(request.user, User)
    try:
        found = report(request.GET, request.user)
    except (ValueError, NotYours) as problem:
        return render(request, "portal/usage.html", {"problem": str(problem), "by_choices": BY}, status=400)
    rows = Paginator(found["rows"], TABLE_PAGE).get_page(request.GET.get("page"))
    rows.object_list = [{k: as_text(v) for k, v in r.items()} for r in rows.object_list]
    others = request.GET.copy()
    others.pop("page", None)
    context = {
        **found,
        "page": rows,
        "page_query": others.urlencode(),
        "hours_svg": hours_chart(found["rows"], found["by"]) if found["rows"] else "",
        "shares_svg": shares_chart(found["shares"]) if found["shares"] else "",
        "by_choices": BY if request.user.is_staff else ("user", "group"),
        "share_labels": [SHARE_LABELS[share] for share in SHARES],
        # Each channel's hours in the order of the columns: the table is the longest part of the page.
        "share_cells": [
            (r["name"], [(SHARE_LABELS[share], as_text(r[share])) for share in SHARES])
            for r in found["shares"]
        ],
    }
    return render(request, "portal/usage.html", context)


@login_required
def usage_csv(request: HttpRequest) -> HttpResponse:
    assert isinstance(request.user, User)
    try:
        found = report(request.GET, request.user)
    except (ValueError, NotYours) as problem:
        return HttpResponse(str(problem), status=400, content_type="text/plain")
    answer = HttpResponse(content_type="text/csv; charset=utf-8")
    answer["Content-Disposition"] = f'attachment; filename="slotserve-usage-{found["by"]}-{found["day"]}.csv"'
    writer = SafeWriter(answer)
    writer.writerow([found["by"], *COLUMNS[1:]])
    for row in found["rows"]:
        writer.writerow([row[c] if row[c] is not None else "" for c in COLUMNS])
    return answer
