"""The Django admin for reservations: every change goes through the services.

Staff never set ``status`` by hand: approving, rejecting (with a reason) and
cancelling are actions that call the same services as the API and the portal,
so the owner is notified and the channel re-decides. Adding or moving a
reservation here is a booking like any other (overlap, limits, re-decision).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from reservations import people_admin, services  # noqa: F401  (people_admin: the User admin)
from reservations.forms import RejectForm
from reservations.models import Blackout, Bulletin, GroupPolicy, Notification, Reservation
from slotserve_base.admin_services import SavedByServicesAdmin
from slotserve_base.errors import InvalidInput

LOCKED_FIELDS = ["status", "reject_reason", "reviewed_by", "reviewed_at", "extends", "created"]
USAGE_FIELDS = ["requests", "prompt_tokens", "completion_tokens"]


def service_errors_as_form_errors(work: Callable[[], Any]) -> Any:
    """Run a service; its refusal becomes the form's error, naming the field where it can."""
    try:
        return work()
    except InvalidInput as exc:
        raise ValidationError({exc.field: exc.message} if exc.field else exc.message) from None
    except (services.ReservationConflict, services.InvalidTransition) as exc:
        raise ValidationError(exc.message) from None


def _staff(request: HttpRequest) -> User:
    """The admin's user: the admin site lets only signed-in staff in."""
    assert isinstance(request.user, User)
    return request.user


class ReservationAdminForm(forms.ModelForm[Reservation]):
    """Saves through ``reservation_create`` (a new one) or ``reservation_reschedule``."""

    request_user: User | None = None  # set per request by ``ReservationAdmin.get_form``

    class Meta:
        model = Reservation
        fields = ["user", "channel", "start", "end", "model", "preset", "exclusive", "note"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        assert self.request_user is not None, "made by ReservationAdmin.get_form"
        by = self.request_user
        now = timezone.now()
        if self.instance.pk is None:
            self.instance = service_errors_as_form_errors(
                lambda: services.reservation_create(
                    services.NewBooking(
                        user=data["user"],
                        channel=data["channel"],
                        start=data["start"],
                        end=data["end"],
                        model=data.get("model"),
                        preset=data.get("preset"),
                        exclusive=bool(data.get("exclusive")),
                        note=data.get("note", ""),
                        by=by,
                    ),
                    now=now,
                )
            )
        else:
            self.instance = service_errors_as_form_errors(
                lambda: services.reservation_reschedule(
                    reservation=self.instance,
                    by=by,
                    start=data["start"],
                    end=data["end"],
                    note=data.get("note", ""),
                    now=now,
                )
            )
        return data


@admin.register(Reservation)
class ReservationAdmin(SavedByServicesAdmin[Reservation]):
    form = ReservationAdminForm
    list_display = ["channel", "user", "start", "end", "model", "preset", "exclusive", "status"]
    list_filter = ["status", "exclusive", "channel"]
    search_fields = ["user__username", "note"]
    date_hierarchy = "start"
    raw_id_fields = ["user"]
    readonly_fields = [*LOCKED_FIELDS, *USAGE_FIELDS]
    actions = ["approve", "reject", "cancel"]

    def get_readonly_fields(self, request: HttpRequest, obj: Reservation | None = None) -> list[str]:
        if obj is None:
            return list(self.readonly_fields)
        # Another owner, channel or target is another booking: book it, cancel this one.
        return [*self.readonly_fields, "user", "channel", "model", "preset", "exclusive"]

    def has_delete_permission(self, request: HttpRequest, obj: Reservation | None = None) -> bool:
        return False  # cancel instead: the owner is told and the channel re-decides

    def _each(
        self,
        request: HttpRequest,
        queryset: QuerySet[Reservation],
        verb: str,
        act: Callable[[Reservation], Any],
    ) -> None:
        done = 0
        for reservation in queryset.select_related("user", "channel"):
            try:
                act(reservation)
            except (InvalidInput, services.InvalidTransition, services.ReservationConflict) as exc:
                self.message_user(request, f"Reservation {reservation.pk}: {exc.message}", messages.ERROR)
            else:
                done += 1
        if done:
            self.message_user(request, f"{verb} {done} reservation(s).", messages.SUCCESS)

    @admin.action(description="Approve the selected reservations")
    def approve(self, request: HttpRequest, queryset: QuerySet[Reservation]) -> None:
        now = timezone.now()
        self._each(
            request,
            queryset,
            "Approved",
            lambda r: services.reservation_approve(reservation=r, by=_staff(request), now=now),
        )

    @admin.action(description="Reject the selected reservations (asks for a reason)")
    def reject(self, request: HttpRequest, queryset: QuerySet[Reservation]) -> HttpResponse | None:
        form = RejectForm(request.POST if "reason" in request.POST else None)
        if form.is_valid():
            now = timezone.now()
            reason = form.cleaned_data["reason"]
            self._each(
                request,
                queryset,
                "Rejected",
                lambda r: services.reservation_reject(
                    reservation=r, by=_staff(request), reason=reason, now=now
                ),
            )
            return None
        return TemplateResponse(
            request,
            "admin/reservations/reject.html",
            {
                **self.admin_site.each_context(request),
                "title": "Reject reservations",
                "form": form,
                "reservations": queryset,
                "opts": self.model._meta,
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
            },
        )

    @admin.action(description="Cancel the selected reservations")
    def cancel(self, request: HttpRequest, queryset: QuerySet[Reservation]) -> None:
        now = timezone.now()
        self._each(
            request,
            queryset,
            "Cancelled",
            lambda r: services.reservation_cancel(reservation=r, by=_staff(request), now=now),
        )


@admin.register(GroupPolicy)
class GroupPolicyAdmin(admin.ModelAdmin[GroupPolicy]):
    list_display = ["group", "share_weight", "loads_on_demand"]
    filter_horizontal = ["approvers"]


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin[Notification]):
    list_display = ["user", "event", "created", "read"]
    list_filter = ["event", "read"]
    search_fields = ["user__username", "text"]


class MadeInThePortalAdmin(admin.ModelAdmin[Any]):
    """Read here; made and removed on the portal's Blackouts page, where the services check them
    (a blackout cancels the bookings it overlaps only when staff say so there)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Blackout)
class BlackoutAdmin(MadeInThePortalAdmin):
    list_display = ["start", "end", "reason", "created_by"]
    search_fields = ["reason"]


@admin.register(Bulletin)
class BulletinAdmin(MadeInThePortalAdmin):
    list_display = ["__str__", "shown_from", "shown_until", "created_by"]
    search_fields = ["text"]
