"""Sign-in with OpenID Connect (mozilla-django-oidc), mapping the provider's groups claim to
SlotServe groups and one of them to staff. On only when ``SLOTSERVE_OIDC_CLIENT_ID`` is set."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView


def _username(claims: dict[str, Any]) -> str:
    return str(claims.get("preferred_username") or claims.get("email") or claims["sub"])[:150]


def sync_directory_groups(user: User, names: list[str], *, staff_group: str) -> None:
    """The user's groups become exactly the directory's (made as needed); the staff group, if
    named, decides ``is_staff``. Superusers keep theirs."""
    with transaction.atomic():
        groups = [Group.objects.get_or_create(name=name[:150])[0] for name in names if name]
        user.groups.set(groups)
        if staff_group:
            staff = staff_group in names
            if user.is_staff != staff and not user.is_superuser:
                user.is_staff = staff
                user.save(update_fields=["is_staff"])


class DirectoryOIDCBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    """Users are found by their username (``preferred_username``, else email, else ``sub``);
    their groups and staff flag follow the provider's claims at every sign-in."""

    def retrieve_matching_jwk(self, token: Any) -> Any:
        """The provider's signing key. A token whose header names no key (providers with a single
        signing key may leave ``kid`` out) is checked against the one key of its algorithm."""
        import jwt
        import requests
        from django.core.exceptions import SuspiciousOperation

        header = jwt.get_unverified_header(token)
        if "kid" in header:
            return super().retrieve_matching_jwk(token)
        answer = requests.get(self.OIDC_OP_JWKS_ENDPOINT, timeout=self.get_settings("OIDC_TIMEOUT", 10))
        answer.raise_for_status()
        keys = [
            k for k in answer.json().get("keys", []) if k.get("alg", header.get("alg")) == header.get("alg")
        ]
        if len(keys) != 1:
            raise SuspiciousOperation("the ID token names no signing key and the provider has several")
        return jwt.PyJWK(keys[0])

    def filter_users_by_claims(self, claims: dict[str, Any]) -> Any:
        return self.UserModel.objects.filter(username=_username(claims))

    def create_user(self, claims: dict[str, Any]) -> User:
        user = self.UserModel.objects.create_user(
            username=_username(claims),
            email=claims.get("email", ""),
            first_name=claims.get("given_name", ""),
            last_name=claims.get("family_name", ""),
        )
        self._sync(user, claims)
        return user  # type: ignore[no-any-return]

    def update_user(self, user: User, claims: dict[str, Any]) -> User:
        self._sync(user, claims)
        return user

    def _sync(self, user: User, claims: dict[str, Any]) -> None:
        raw = claims.get(settings.SLOTSERVE_OIDC_GROUPS_CLAIM) or []
        names = [str(g) for g in raw] if isinstance(raw, list) else [str(raw)]
        sync_directory_groups(user, names, staff_group=settings.SLOTSERVE_OIDC_STAFF_GROUP)


def _configured() -> None:
    if not settings.SLOTSERVE_OIDC_CLIENT_ID:
        raise Http404("sign-in with OpenID Connect is not set up here (SLOTSERVE_OIDC_CLIENT_ID)")


def oidc_start(request: HttpRequest) -> HttpResponse:
    _configured()
    return OIDCAuthenticationRequestView.as_view()(request)  # type: ignore[no-any-return]


def oidc_callback(request: HttpRequest) -> HttpResponse:
    _configured()
    return OIDCAuthenticationCallbackView.as_view()(request)  # type: ignore[no-any-return]
