"""Shows every page in the signed-in user's own time zone (the database holds UTC); refuses a
body in a charset other than UTF-8 before anything reads it."""

from __future__ import annotations

import codecs
import zoneinfo
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone


class UserTimezoneMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # The zone is this request's alone: the thread goes on to other people's work (a
        # websocket's, the next request's) in the site's zone.
        zone = self.zone(request)
        if zone is None:
            timezone.deactivate()
        else:
            timezone.activate(zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()

    @staticmethod
    def zone(request: HttpRequest) -> zoneinfo.ZoneInfo | None:
        if not request.user.is_authenticated:
            return None
        from reservations.profiles import profile_for

        try:
            return zoneinfo.ZoneInfo(profile_for(request.user).time_zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            return None


# What a body may be written in: UTF-8 (ASCII is a part of it).
ACCEPTED_CHARSETS = frozenset({"utf-8", "ascii"})


def charset_refused(content_type: str) -> str | None:
    """The charset a ``Content-Type`` names, when it is one SlotServe does not read, else None.
    A decoder such as ``unicode_escape`` or ``utf-7`` turns a form's bytes into lone surrogates,
    which no database stores (docs/security.md)."""
    for parameter in content_type.split(";")[1:]:
        name, _, value = parameter.strip().partition("=")
        if name.strip().lower() != "charset":
            continue
        charset = value.strip().strip('"')
        try:
            known = codecs.lookup(charset).name
        except LookupError:
            return charset
        return None if known in ACCEPTED_CHARSETS else charset
    return None


class BodyCharsetMiddleware:
    """``400`` naming the charset for a body that is not UTF-8: JSON under ``/api/``, a line
    of text elsewhere; the same for every form and API route, before any parser reads it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refused = charset_refused(request.META.get("CONTENT_TYPE", ""))
        if refused is None:
            return self.get_response(request)
        message = f"the body's charset {refused!r} is not accepted: send it in UTF-8"
        if request.path.startswith("/api/"):
            return JsonResponse({"message": message, "code": "charset"}, status=400)
        return HttpResponse(message, status=400, content_type="text/plain; charset=utf-8")
