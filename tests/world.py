"""The world a test meets: one typed value, the same shape in every module.

A module's ``world`` fixture builds the lab its tests need (its channels, models, presets,
people and keys) and returns a ``World``; what a module does not need stays None. Tests read
``world.channel``, ``world.ana_key`` …, and a misspelt field fails at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.contrib.auth.models import User
from rest_framework.test import APIClient

from channels_app.models import Channel, LLMModel, Node, Preset
from reservations.models import Reservation


@dataclass(frozen=True, kw_only=True)
class World:
    channel: Channel  # the channel the tests are about
    model: LLMModel  # the model booked or served there
    preset: Preset | None = None  # ``model``'s preset, where bookings name one
    other: Channel | None = None  # a second channel, serving ``other_model``
    other_model: LLMModel | None = None
    other_preset: Preset | None = None
    node: Node | None = None
    ana: User | None = None
    bo: User | None = None
    ana_key: str = ""  # API keys for the gateway
    bo_key: str = ""
    booked: Reservation | None = None  # the booking the tests are about
    start: datetime | None = None  # when ``booked`` starts
    log: Path | None = None  # the run log of ``channel``'s process
    now: datetime | None = None  # the moment the tests take as now, where it is not a frozen T0
    api: APIClient | None = None  # a REST client signed in as the module's booker


@dataclass(frozen=True)
class Tiny:
    """The tiny GGUF model written at test time, with two presets: ``small`` (256 tokens of
    context) and ``big`` (512), so a test can switch between two real loads."""

    model: LLMModel
    small: Preset
    big: Preset
