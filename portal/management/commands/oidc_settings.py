"""``manage.py oidc_settings ISSUER``: the SLOTSERVE_OIDC_* lines for a provider, read from its
discovery document (``ISSUER/.well-known/openid-configuration``)."""

from __future__ import annotations

from typing import Any

import httpx
from django.core.management.base import BaseCommand, CommandError, CommandParser

ENDPOINTS = {
    "SLOTSERVE_OIDC_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "SLOTSERVE_OIDC_TOKEN_ENDPOINT": "token_endpoint",
    "SLOTSERVE_OIDC_USERINFO_ENDPOINT": "userinfo_endpoint",
    "SLOTSERVE_OIDC_JWKS_ENDPOINT": "jwks_uri",
}


class Command(BaseCommand):
    help = "Print the SLOTSERVE_OIDC_* settings of an OpenID Connect provider, from its discovery document."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("issuer", help="e.g. https://sso.lab.example/realms/lab")
        parser.add_argument("--client-id", default="slotserve")

    def handle(self, *args: Any, **options: Any) -> None:
        issuer = options["issuer"].rstrip("/")
        url = f"{issuer}/.well-known/openid-configuration"
        try:
            answer = httpx.get(url, timeout=10, follow_redirects=True)
            answer.raise_for_status()
            document = answer.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise CommandError(f"could not read {url}: {exc}") from None
        missing = [key for key in ENDPOINTS.values() if not document.get(key)]
        if missing:
            raise CommandError(f"{url} lacks {', '.join(missing)}")
        algorithms = document.get("id_token_signing_alg_values_supported") or ["RS256"]
        lines = [f"SLOTSERVE_OIDC_CLIENT_ID={options['client_id']}", "SLOTSERVE_OIDC_CLIENT_SECRET="]
        lines += [f"{name}={document[key]}" for name, key in ENDPOINTS.items()]
        lines.append(f"SLOTSERVE_OIDC_SIGN_ALGO={'RS256' if 'RS256' in algorithms else algorithms[0]}")
        self.stdout.write("\n".join(lines))
