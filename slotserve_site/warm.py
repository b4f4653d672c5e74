"""A web process made ready before its first request: every view module imported (the URLconf
resolved) and every template of the project compiled into the cached loader.

Otherwise the first request each web process answers does it (about 190 ms at a lab of a thousand,
the URLconf's imports most of it), and with two processes the first two pages anyone opens after
a start were the slowest of all (docs/benchmarks.md). Done before the process freezes what start-up
made (``slotserve_site.asgi``), so the collector never walks these either. No database is touched:
a process starts while PostgreSQL is still coming up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.template.loader import get_template
from django.urls import get_resolver


def warm_up() -> int:
    """Resolve the URLconf and compile the project's templates; how many templates."""
    get_resolver().url_patterns  # noqa: B018 — reading it imports every view module
    compiled = 0
    engine: dict[str, Any] = settings.TEMPLATES[0]
    folders = [Path(folder) for folder in engine["DIRS"]]
    for folder in folders:
        for path in sorted(folder.rglob("*.html")):
            get_template(path.relative_to(folder).as_posix())
            compiled += 1
    return compiled
