"""Refusals the services raise; every edge (API, portal, admin) turns them into its own answer."""

from __future__ import annotations


class InvalidInput(Exception):
    """A request names something that does not fit; ``field`` says which."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class InUse(Exception):
    """The object runs or is wanted on a channel now; ``message`` names where."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
