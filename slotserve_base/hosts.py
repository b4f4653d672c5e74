"""Where a process is reached: shared by the node worker (its probes) and the gateway (its
upstreams)."""

from __future__ import annotations


def url_host(host: str) -> str:
    """How to write ``host`` in a URL that reaches it (a wildcard bind means this machine)."""
    if host in {"0.0.0.0", ""}:
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
