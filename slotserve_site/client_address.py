"""Where a request comes from: the socket's address, unless that is a proxy the deployment
names in ``SLOTSERVE_TRUSTED_PROXIES``; then the last address in ``X-Forwarded-For`` that is
not one of them (each proxy appends the address it was called from, so the entries to the
right of the last trusted proxy are the only ones a caller cannot forge).

The sign-in lock-out counts failures per account and address (django-axes), so an address a
caller could choose would let them guess without end, or sign in to a locked-out account
from "elsewhere" (docs/security.md).
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def proxy_networks(names: list[str] | tuple[str, ...]) -> tuple[Network, ...]:
    """``names`` (addresses or networks: ``127.0.0.1``, ``10.0.0.0/8``) as networks;
    ``ValueError`` naming one that is neither."""
    return tuple(ipaddress.ip_network(name.strip(), strict=False) for name in names)


@lru_cache(maxsize=8)
def _trusted(names: tuple[str, ...]) -> tuple[Network, ...]:
    return proxy_networks(names)


def _is_trusted(address: str, trusted: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return False
    return any(ip in network for network in trusted)


def client_address(request: HttpRequest) -> str:
    """The caller's address as this deployment can know it (see the module's words)."""
    address = str(request.META.get("REMOTE_ADDR") or "")
    trusted = _trusted(tuple(settings.SLOTSERVE_TRUSTED_PROXIES))
    if not trusted or not _is_trusted(address, trusted):
        return address
    forwarded = [hop.strip() for hop in str(request.META.get("HTTP_X_FORWARDED_FOR", "")).split(",")]
    for hop in reversed([hop for hop in forwarded if hop]):
        if not _is_trusted(hop, trusted):
            return hop
        address = hop
    return address
