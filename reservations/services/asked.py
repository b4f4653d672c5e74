"""What a booking asks for, as one value (``NewBooking``): the booking services, the REST API, the
portal and the admin pass it whole instead of the same ten fields each."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth.models import User

from channels_app.models import Channel, LLMModel, Preset
from slotserve_base.errors import InvalidInput

# The fields a form or a serializer may carry into a ``NewBooking`` (others, like a series' repeat,
# are the caller's own).
FIELDS = ("channel", "start", "end", "model", "preset", "exclusive", "note", "lend")


@dataclass(frozen=True)
class NewBooking:
    """Who a booking is for, where and when, what runs in it (a model and preset, or the whole
    card), its note, whether its idle time is lent; ``by``: who books it for them (staff), when
    someone else. ``channel`` None: the best channel that fits (``reservation_create_anywhere``)."""

    user: User
    channel: Channel | None
    start: datetime
    end: datetime
    model: LLMModel | None = None
    preset: Preset | None = None
    exclusive: bool = False
    note: str = ""
    lend: bool = False
    by: User | None = None

    @classmethod
    def of(cls, user: User, fields: dict[str, Any], **more: Any) -> NewBooking:
        """A booking from validated input: ``FIELDS`` taken from ``fields``, the rest ignored."""
        return cls(user=user, **{name: fields[name] for name in FIELDS if name in fields}, **more)

    @property
    def where(self) -> Channel:
        if self.channel is None:
            raise InvalidInput("channel", "name a channel")
        return self.channel

    def in_utc(self) -> NewBooking:
        """The same, its times in UTC: Python subtracts two times of one zone as wall-clock
        times, which is wrong across a daylight-saving change."""
        return self.at(self.start, self.end)

    def at(self, start: datetime, end: datetime) -> NewBooking:
        return dataclasses.replace(self, start=start.astimezone(UTC), end=end.astimezone(UTC))

    def on(self, channel: Channel) -> NewBooking:
        return dataclasses.replace(self, channel=channel)
