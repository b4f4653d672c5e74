"""Typed readers for SlotServe's environment settings.

A bad value stops start-up with the variable's name and what was expected,
rather than surfacing later as a confusing failure deep in a request.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit


class SettingError(Exception):
    """A setting in the environment has a value SlotServe cannot use."""


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_url(name: str, default: str = "") -> str:
    """An http(s) address without its trailing slash, or ``default``."""
    raw = os.environ.get(name, "").strip().rstrip("/")
    if not raw:
        return default
    if not raw.startswith(("http://", "https://")) or not raw.split("://", 1)[1]:
        raise SettingError(f"{name}={raw!r}: write the address people open, e.g. https://gpu.lab.example")
    return raw


def redis_broker_url(url: str) -> str:
    """Celery's broker URL for the Redis at ``url``. redis-py names a Unix socket
    ``unix://[:password@]/path?db=N``; Kombu, Celery's transport, ``redis+socket://`` with the
    database as ``virtual_host``. Any other URL is the same for both."""
    if not url.startswith("unix://"):
        return url
    parts = urlsplit(url)
    database = parse_qs(parts.query).get("db", ["0"])[0]
    return urlunsplit(("redis+socket", parts.netloc, parts.path, f"virtual_host={database}", ""))


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise SettingError(f"{name}={raw!r} is not a boolean: use true/false, yes/no, on/off or 1/0")


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not a number") from None
    if value != value or value < minimum:  # NaN or below the floor
        raise SettingError(f"{name}={raw!r} must be a number >= {minimum:g}")
    return value


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise SettingError(f"{name}={raw!r} must be a whole number >= {minimum}")
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (upper case), whatever the case it is written in."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().upper()
    if value not in choices:
        raise SettingError(f"{name}={raw!r} is not one of {', '.join(choices)}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_seconds_list(name: str, default: list[float]) -> list[float]:
    """A comma-separated list of seconds (``5,60,300``), each positive."""
    found = []
    for item in env_list(name, []):
        try:
            value = float(item)
        except ValueError:
            raise SettingError(f"{name}: {item!r} is not a number of seconds") from None
        if not value > 0:
            raise SettingError(f"{name}: {item!r} must be more than 0 seconds")
        found.append(value)
    return found or default


def env_port_range(name: str, default: str) -> range | None:
    """A range of ports written ``first-last`` (both included), or "any" for none: the kernel
    then picks. Anything else stops start-up naming it."""
    raw = (os.environ.get(name) or default).strip()
    if raw.lower() == "any":
        return None
    first, dash, last = raw.partition("-")
    try:
        ports = range(int(first), int(last if dash else first) + 1)
    except ValueError:
        raise SettingError(f"{name}={raw!r}: write a range of ports, e.g. 31000-31999, or any") from None
    wrong = (
        "the first port is above the last"
        if not ports
        else "ports must be 1024 or more"
        if ports.start < 1024
        else "ports must be 65535 or less"
        if ports.stop > 65536
        else ""
    )
    if wrong:
        raise SettingError(f"{name}={raw!r}: {wrong}")
    return ports


# Keys that placeholders, examples and tutorials use.
_PLACEHOLDERS = ("change", "secret", "example", "placeholder", "insecure", "your-", "xxxx", "password")


def env_networks(name: str, default: list[str]) -> list[str]:
    """A comma-separated list of addresses or networks (``10.0.0.5,10.1.0.0/16``); "none" for
    none. Anything else stops start-up naming it."""
    found = [item for item in env_list(name, default) if item.lower() != "none"]
    for item in found:
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError as exc:
            raise SettingError(
                f"{name}: {exc} (name addresses or networks, e.g. 10.0.0.5,10.1.0.0/16)"
            ) from None
    return found


def secret_key_weakness(key: str) -> str:
    """Why ``key`` is too weak to sign sessions with, or "" when it will do."""
    if len(key) < 32:
        return f"only {len(key)} characters long (at least 32 are needed)"
    if len(set(key)) < 10:
        return "made of too few different characters"
    lowered = key.lower()
    for word in _PLACEHOLDERS:
        if word in lowered:
            return f"a placeholder (it contains {word!r})"
    return ""


def secret_key(data_dir: Path) -> str:
    """``SLOTSERVE_SECRET_KEY`` (a weak one stops start-up), else a key kept in ``data_dir``'s
    ``secret_key`` (0600), made at the first start."""
    from_env = env_str("SLOTSERVE_SECRET_KEY", "")
    if from_env:
        weakness = secret_key_weakness(from_env)
        if weakness:
            raise SettingError(
                f"SLOTSERVE_SECRET_KEY is {weakness}: use a long random string, e.g. the output of "
                "python3 -c 'import secrets; print(secrets.token_urlsafe(50))'"
            )
        return from_env
    key_file = data_dir / "secret_key"
    if not key_file.exists():
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(50))
    key_file.chmod(0o600)
    return key_file.read_text().strip()
