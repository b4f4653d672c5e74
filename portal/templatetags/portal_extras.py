"""Small filters the portal's templates need."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django import template

from slotserve_base.admin_fields import gib as gib_of

register = template.Library()


@register.filter
def get_item(mapping: Mapping[str, Any], key: str) -> Any:
    """``filters|get_item:name``: a mapping's value by a key held in a variable."""
    return mapping.get(key)


@register.filter
def as_json(value: Any) -> str:
    """A value as JSON for a ``data-`` attribute (the template's escaping keeps it intact)."""
    return json.dumps(value, separators=(",", ":"))


@register.filter
def percent(value: float) -> str:
    """A fraction as a whole percentage: ``0.624|percent`` is "62 %"."""
    return f"{int(value * 100)} %"


@register.filter
def gib(size: int | None) -> str:
    """Memory in GiB, named so: ``24 GiB`` (Django's ``filesizeformat`` writes GiB as "GB")."""
    return gib_of(size)


@register.filter
def expiry(moment: datetime) -> str:
    """A key's expiry as the keys page asks it: its last day (``reservations.wording``)."""
    from reservations.wording import expiry_words

    return expiry_words(moment)


@register.filter
def own_limits(key: Any) -> str:
    """A key's own limits in words: ``1 at once, 30 a minute, 50000 tokens a week``, or ``—``."""
    said = [
        f"{value} {words}"
        for value, words in (
            (key.max_concurrent, "at once"),
            (key.requests_per_minute, "a minute"),
            (key.weekly_tokens, "tokens a week"),
        )
        if value
    ]
    return ", ".join(said) or "—"
