"""The calendar's lanes: what sits on a channel's day (bookings, minutes lost to loading,
blackouts, preloads), in percent of the day's width, and the lanes as HTML (the Calendar in
docs/portal.md). Written here, each value escaped, rather than through the template's tags: a week of
fifty channels through them cost more than all the page's queries (docs/benchmarks.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from html import escape
from typing import Any

from django.utils.safestring import SafeString, mark_safe

from channels_app.models import Channel


@dataclass
class Block:
    """Something placed on the timeline, in percent of the row's width."""

    left: float
    width: float
    css: str
    label: str
    title: str
    details: dict[str, Any] | None = None  # a booking's, shown when it is clicked
    short: str = ""  # a booking's second line: what it runs, shortened (the title has it whole)

    @property
    def style(self) -> str:
        """Where it sits, as CSS: written here once, not through a template filter per number
        (a week of fifty channels has thousands)."""
        return f"left:{self.left:.3f}%;width:{self.width:.3f}%"


@dataclass
class CalendarRow:
    channel: Channel
    blocks: list[Block] = field(default_factory=list)
    plan: list[Block] = field(default_factory=list)
    closed: list[Block] = field(default_factory=list)  # its blackouts (docs/portal.md)

    def html(self) -> SafeString:
        """Its bookings (buttons that open their details), the minutes lost to loading, its
        blackouts and its preloads, as the lane's HTML: written here, each value escaped, because
        a week of fifty channels through the template's tags cost more than all its queries."""
        out = []
        for b in self.blocks:
            where = f'class="{escape(b.css)}" style="{b.style}" title="{escape(b.title)}"'
            if b.details:
                details = escape(json.dumps(b.details, separators=(",", ":")))
                short = f'<span class="what">{escape(b.short)}</span>' if b.short else ""
                out.append(
                    f'<button type="button" {where} data-details="{details}">'
                    f'<span class="who">{escape(b.label)}</span>{short}</button>'
                )
            else:
                out.append(f"<div {where}></div>")
        for b in self.closed:
            out.append(f'<div class="{escape(b.css)}" style="{b.style}" title="{escape(b.title)}">')
            out.append(f"{escape(b.label)}</div>")
        out += [
            f'<div class="{escape(b.css)}" style="{b.style}" title="{escape(b.title)}"></div>'
            for b in self.plan
        ]
        return mark_safe("".join(out))


def placed(start: datetime, end: datetime, origin: datetime, span: timedelta) -> tuple[float, float] | None:
    lo, hi = max(start, origin), min(end, origin + span)
    if hi <= lo:
        return None
    return (lo - origin) / span * 100, (hi - lo) / span * 100


def lane_html(lane: dict[str, Any], *, week: bool, first: bool, book_url: str) -> SafeString:
    """A channel's row of the calendar (its name, node and booking link, then a timeline a day),
    as HTML: written here, each value escaped, because fifty channels' weeks through the
    template's tags cost more than all the page's queries (docs/benchmarks.md)."""
    channel = lane["channel"]
    name = escape(channel.name)
    out = [
        f'<div class="row" data-channel="{name}">\n  <div><strong>{name}</strong><br>'
        f'<span class="muted">{escape(channel.node.name)}</span>\n'
        f'    <a class="book-link" href="{book_url}?channel={channel.pk}">Book…</a></div>\n  <div>\n'
    ]
    for index, d in enumerate(lane["days"]):
        origin = d["origin"]
        if week:
            out.append(f'    <div class="lane-label">{escape(d["label"])}</div>\n')
        anchor = ' id="first-lane"' if first and index == 0 else ""
        said = f"{name}, {origin:%a} {origin.day} {origin:%b}"
        out.append(
            f'    <div{anchor} class="timeline{" lane" if week else ""}" data-channel-id="{channel.pk}" '
            f'data-channel-name="{name}" data-origin="{origin.isoformat()}" data-span="{d["span_seconds"]}" '
            f'tabindex="0" role="group" aria-label="{said}: arrow keys choose a time, Shift with the arrows '
            f'its length, Enter books it" aria-describedby="lane-cursor">\n'
        )
        if d["past"]:
            out.append(f'      <div class="past" style="width:{d["past"]:.3f}%"></div>\n')
        out.append(f"      {d['row'].html()}\n")
        if d["now_left"] is not None:
            out.append(f'      <div class="now" style="left:{d["now_left"]:.3f}%"></div>\n')
        out.append("    </div>\n")
    out.append("  </div>\n</div>\n")
    return mark_safe("".join(out))
