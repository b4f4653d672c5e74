"""Admin pages whose saves go through a service (docs/architecture.md: every write goes through a service).

The form's ``clean`` calls the service, so a refusal shows as a form error and nothing is
half-saved; the form learns who saves from ``request_user``, set here per request.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

M = TypeVar("M", bound=Model)


class SavedByServicesAdmin(admin.ModelAdmin[M]):
    def get_form(
        self, request: HttpRequest, obj: M | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form: Any = super().get_form(request, obj, change, **kwargs)
        form.request_user = request.user  # who saves, for the service (a class made per request)
        return form

    def save_model(self, request: HttpRequest, obj: M, form: Any, change: bool) -> None:
        """The form's ``clean`` saved it through the services already."""
