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


class TooManyTries(Exception):
    """Something that may be done only so often was done too often; ``retry_after``: the
    seconds until it may be done again (the edges answer 429 with ``Retry-After``)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class OutsideScope(Exception):
    """An API key asked for more than its own scope allows; ``message`` names the scope (the
    edges answer ``403 key_scope``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
