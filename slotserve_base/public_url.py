"""Whole addresses of the portal's pages, for what leaves the page: the calendar feed's address,
the gateway's base URL for scripts, links in emails."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def public_url(path: str, request: HttpRequest | None = None) -> str | None:
    """``path`` at the portal's public address (``SLOTSERVE_PUBLIC_URL``), else at the address
    ``request`` came to; None with neither (an email has no request to go by)."""
    base = settings.SLOTSERVE_PUBLIC_URL
    if base:
        return f"{base}{path}"
    return request.build_absolute_uri(path) if request is not None else None
