"""The password-reset mail links to the portal's public address (``SLOTSERVE_PUBLIC_URL``), never
to whatever ``Host`` a request for it named: a stranger asking a reset for someone else's address
with ``Host: evil.example`` must not get that person a link to evil.example (docs/security.md)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.forms import PasswordResetForm
from django.contrib.auth.views import PasswordResetView


class PublicAddressResetForm(PasswordResetForm):
    def save(self, *args: Any, **kwargs: Any) -> None:
        base = settings.SLOTSERVE_PUBLIC_URL
        if base:
            parts = urlsplit(base)
            kwargs["domain_override"] = parts.netloc + parts.path
            kwargs["use_https"] = parts.scheme == "https"
        super().save(*args, **kwargs)


class PublicAddressResetView(PasswordResetView):
    form_class = PublicAddressResetForm
