"""Small builders for test data, with sensible defaults."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone

from channels_app.models import Channel, Gpu, LLMModel, LoadRecord, Node, Preset
from reservations.models import Reservation, ReservationStatus

GiB = 2**30
_seq = itertools.count(1)


def user(username: str | None = None, *, staff: bool = False, **extra: Any) -> Any:
    name = username or f"user{next(_seq)}"
    return get_user_model().objects.create_user(
        username=name, password="pw-for-tests", email=f"{name}@example.org", is_staff=staff, **extra
    )


def node(name: str | None = None, *, gpus: int = 1, memory: int = 24 * GiB, **extra: Any) -> Node:
    created = Node.objects.create(name=name or f"node{next(_seq)}", last_heartbeat=timezone.now(), **extra)
    for index in range(gpus):
        Gpu.objects.create(node=created, index=index, name="Test GPU", memory_bytes=memory)
    return created


def llm(
    name: str | None = None, *, size: int = 4 * 10**9, backend: str = "llama.cpp", path: str | None = None
) -> LLMModel:
    label = name or f"model{next(_seq)}"
    return LLMModel.objects.create(
        name=label, backend=backend, path=path or f"/models/{label}.gguf", size_bytes=size
    )


def preset(model: LLMModel, name: str = "default", args: str = "") -> Preset:
    return Preset.objects.create(model=model, name=name, args=args)


def channel(
    name: str | None = None,
    *,
    on: Node | None = None,
    default: Preset | None = None,
    policy: str = "none",
    gpu_indexes: list[int] | None = None,
) -> Channel:
    return Channel.objects.create(
        name=name or f"ch{next(_seq)}",
        node=on or node(),
        gpu_indexes=gpu_indexes or [0],
        approval_policy=policy,
        default_model=default.model if default else None,
        default_preset=default,
    )


def reservation(
    *,
    owner: Any,
    on: Channel,
    start: datetime,
    end: datetime,
    target: Preset | None = None,
    status: str = ReservationStatus.APPROVED,
) -> Reservation:
    return Reservation.objects.create(
        user=owner,
        channel=on,
        start=start,
        end=end,
        model=target.model if target else None,
        preset=target,
        exclusive=target is None,
        status=status,
    )


def load(
    target: Preset,
    on: Channel,
    *,
    started: datetime,
    seconds: float,
    succeeded: bool = True,
    estimated: float | None = None,
) -> LoadRecord:
    return LoadRecord.objects.create(
        estimated_seconds=estimated,
        model=target.model,
        preset=target,
        node=on.node,
        channel=on,
        started=started,
        finished=started + timedelta(seconds=seconds),
        succeeded=succeeded,
    )


def iso(moment: datetime) -> str:
    """A time as the API writes it: ISO 8601 in UTC with ``Z``."""
    return moment.isoformat().replace("+00:00", "Z")


def client_for(user: Any, *, csrf: bool = False) -> Any:
    """A test client signed in as ``user`` (checking CSRF tokens when ``csrf``)."""
    from django.test import Client

    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def in_zone(user: Any, zone: str) -> None:
    """``user`` chose the time zone ``zone`` in their settings."""
    from reservations.profiles import profile_for

    profile = profile_for(user)
    profile.time_zone, profile.time_zone_chosen = zone, True
    profile.save()
