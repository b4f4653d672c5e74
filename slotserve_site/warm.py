"""A web process made ready before its first request: every view module imported (the URLconf
resolved), every resolver's reverse look-ups filled, and every template of the project compiled
into the cached loader.

Otherwise the first request each web process answers does it (about 190 ms at a lab of a
thousand, the URLconf's imports most of it; then 183 ms more of its first overview for the reverse
look-ups, which Django fills at the first ``reverse`` of each resolver), and with two processes
the first two pages anyone opens after a start were the slowest of all (docs/benchmarks.md). Done
before the process freezes what start-up made (``slotserve_site.asgi``), so the collector never
walks these either. No database is touched: a process starts while PostgreSQL is still coming
up."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.template.loader import get_template
from django.urls import NoReverseMatch, URLResolver, get_resolver, reverse


def warm_up() -> int:
    """Resolve the URLconf, fill its reverse look-ups and compile the project's templates; how
    many templates."""
    _fill(get_resolver())  # reading its patterns imports every view module
    for namespace in _namespaces(get_resolver()):
        # A namespace's names are looked up in a resolver of its own, made and filled at the first
        # ``reverse`` in it: asking for a name it lacks makes and fills it.
        with contextlib.suppress(NoReverseMatch):
            reverse(f"{namespace}:-")
    compiled = 0
    engine: dict[str, Any] = settings.TEMPLATES[0]
    folders = [Path(folder) for folder in engine["DIRS"]]
    for folder in folders:
        for path in sorted(folder.rglob("*.html")):
            get_template(path.relative_to(folder).as_posix())
            compiled += 1
    return compiled


def _fill(resolver: URLResolver) -> None:
    """Fill the reverse look-ups of ``resolver`` and of every resolver below it (in the language
    of the settings: another one is filled at its first use)."""
    resolver.reverse_dict  # noqa: B018 — reading it fills it
    for pattern in resolver.url_patterns:
        if isinstance(pattern, URLResolver):
            _fill(pattern)


def _namespaces(resolver: URLResolver, within: str = "") -> Iterator[str]:
    for name, (_, below) in resolver.namespace_dict.items():
        yield within + name
        yield from _namespaces(below, f"{within}{name}:")
