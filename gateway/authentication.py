"""``Authorization: Bearer <key>`` for the REST API (docs/api.md)."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from django.utils import timezone
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from gateway.api_keys import api_key_found
from gateway.models import ApiKey


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, key = header.partition(" ")
        if scheme != self.keyword:
            return None
        key = key.strip()
        if not key:
            raise exceptions.AuthenticationFailed("The Authorization header has no API key after 'Bearer'.")
        found = api_key_found(key)
        if found is None:
            raise exceptions.AuthenticationFailed("The API key is unknown or has been revoked.")
        if found.expires_at is not None and found.expires_at <= timezone.now():
            raise exceptions.AuthenticationFailed(
                f"The API key expired on {found.expires_at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}: create a new "
                "one in the portal."
            )
        if found.read_only and request.method not in permissions.SAFE_METHODS:
            # Whatever the view: a dashboard's key reads, never changes.
            raise exceptions.PermissionDenied(
                "This API key is read-only: it may read, not change anything (create another key for that)."
            )
        return found.user, found

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


def calling_key(request: Request) -> ApiKey | None:
    """The API key a REST request came with; None for a signed-in session."""
    return request.auth if isinstance(request.auth, ApiKey) else None
