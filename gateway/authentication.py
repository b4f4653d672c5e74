"""``Authorization: Bearer <key>`` for the REST API (docs/api.md)."""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from gateway.api_keys import api_key_user


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, None] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, key = header.partition(" ")
        if scheme != self.keyword:
            return None
        key = key.strip()
        if not key:
            raise exceptions.AuthenticationFailed("The Authorization header has no API key after 'Bearer'.")
        user = api_key_user(key)
        if user is None:
            raise exceptions.AuthenticationFailed("The API key is unknown or has been revoked.")
        return user, None

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
