"""Where a webhook may point (docs/webhooks.md, "Addresses"): the public internet, and the networks
staff allow (``SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS``). Not this machine's loopback, not link-local
(a cloud's metadata service), not the private ranges where SlotServe's own Redis, database and
inference processes listen.

A name is resolved at each delivery and the delivery goes to the address that was checked, so
a name that resolves elsewhere a second later (DNS rebinding) cannot carry a delivery inside.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(ValueError):
    """The URL may not be called; the message says why, for the person who gave it."""


class Unresolved(Refused):
    """The URL's host name does not resolve (now)."""


@dataclass(frozen=True)
class Destination:
    """Where one delivery goes: ``url`` with the checked address in place of the name, the
    ``host`` header and the TLS name to ask for."""

    url: str
    host: str
    tls_name: str | None


# IPv6 ranges that carry an IPv4 address in their last 32 bits: IPv4-compatible (deprecated),
# IPv4-translated (SIIT) and the well-known NAT64 prefix; a NAT64 gateway or a host that takes
# them reaches the IPv4 address inside. The local-use NAT64 prefix is never global.
_IPV4_IN_LAST_32 = tuple(ipaddress.ip_network(n) for n in ("::/96", "::ffff:0:0:0/96", "64:ff9b::/96"))
_LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")


def _embedded(address: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries, by every standard embedding: mapped,
    compatible, translated, NAT64, 6to4 and Teredo (its server and its client)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    found = [a for a in (address.ipv4_mapped, address.sixtofour) if a is not None]
    if address.teredo is not None:
        found.extend(address.teredo)
    if any(address in network for network in _IPV4_IN_LAST_32):
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return found


def _inside(address: IPAddress) -> bool:
    """Whether ``address`` is one a webhook may not reach unless staff allow its network: not
    global, multicast, or an IPv6 address that carries such an IPv4 address (``[::127.0.0.1]``,
    ``[64:ff9b::10.0.0.5]``, ``[2002:7f00:1::]``)."""
    if not address.is_global or address.is_multicast:
        return True
    if isinstance(address, ipaddress.IPv6Address) and address in _LOCAL_NAT64:
        return True
    return any(_inside(inner) for inner in _embedded(address))


def _allowed(address: IPAddress) -> bool:
    return any(
        address in ipaddress.ip_network(network, strict=False)
        for network in settings.SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS
    )


def check_url(url: str) -> tuple[str, int]:
    """The host and port of a URL a webhook may have; ``Refused`` naming what is wrong."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Refused(f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise Refused("the URL must start with http:// or https://")
    if not parts.hostname:
        raise Refused("the URL names no host")
    if parts.username or parts.password:
        raise Refused("the URL may not carry a user name or password; put a token in its path or query")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def addresses_of(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to, each one allowed; ``Refused`` when one is not (all
    must be: the connection may take any of them)."""
    try:
        literal: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        found = [literal]
    else:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise Unresolved(f"{host} does not resolve ({exc})") from None
        found = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
    for address in found:
        if _inside(address) and not _allowed(address):
            raise Refused(
                f"{host} is {address}, inside a loopback, link-local or private network; staff may "
                "allow such networks with SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS"
            )
    return found


def destination(url: str) -> Destination:
    """Where a delivery to ``url`` goes now; ``Refused`` when it may not."""
    host, port = check_url(url)
    address = addresses_of(host, port)[0]
    parts = urlsplit(url)
    literal = f"[{address}]" if address.version == 6 else str(address)
    netloc = f"{literal}:{parts.port}" if parts.port else literal
    host_header = parts.netloc.rsplit("@", 1)[-1]
    return Destination(
        url=urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, "")),
        host=host_header,
        tls_name=host if parts.scheme == "https" else None,
    )
