"""A target: what a channel runs, a model + preset as one unit (README, Concepts)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Target:
    """A model + preset: one unit, another preset is another target (README, Concepts).

    ``fingerprint`` digests what a process of it is started with (backend, path, effective
    arguments; ``fingerprint_of``): the node worker sets it, so a preset whose arguments were
    edited is another target there (drain, restart). The scheduler leaves it empty.
    """

    model_id: int
    preset_id: int | None = None
    fingerprint: str = ""


def fingerprint_of(*, backend: str, path: str, args: list[str]) -> str:
    """A short digest of how a process of a target is started."""
    import hashlib

    return hashlib.sha1("\0".join([backend, path, *args]).encode()).hexdigest()[:16]
