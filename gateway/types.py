"""The gateway's shared types, at the bottom of its rooms (as starlette's ``types.py``): the ASGI
messages every stage passes on. Nothing here imports any room, so any room may use them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
