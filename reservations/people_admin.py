"""People in the Django admin: adding one asks their email and groups (notifications go by
email, approvals and share weights by group), and a person without an email is flagged."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.forms import AdminUserCreationForm, UsernameField
from django.contrib.auth.models import Group, User
from django.http import HttpRequest, HttpResponse

from channels_app.inventory.groups import channels_only_allowing, refusal


class PersonCreationForm(AdminUserCreationForm):
    class Meta:
        model = User
        fields = ("username", "email", "first_name", "last_name", "groups")
        field_classes = {"username": UsernameField}


admin.site.unregister(User)


@admin.register(User)
class PersonAdmin(UserAdmin[User]):
    add_form = PersonCreationForm
    add_fieldsets = (
        (
            None,
            {
                "classes": ("wide",),
                "fields": (
                    "username",
                    "email",
                    "first_name",
                    "last_name",
                    "groups",
                    "usable_password",
                    "password1",
                    "password2",
                ),
                "description": "Notifications reach people by email, and their groups decide who "
                "approves their bookings; people who sign in with the lab's accounts (LDAP, OpenID) "
                "get theirs at their first sign-in.",
            },
        ),
    )
    filter_horizontal = ("groups", "user_permissions")
    list_display = ("username", "email", "first_name", "last_name", "is_staff", "is_active")

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        person = self.get_object(request, object_id)
        if request.method == "GET" and person is not None and not person.email:
            messages.warning(
                request,
                f"{person.username} has no email: notifications reach them only in the portal. Add "
                "one below.",
            )
        return super().change_view(request, object_id, form_url, extra_context)


admin.site.unregister(Group)


@admin.register(Group)
class LabGroupAdmin(GroupAdmin):
    """Groups, deleted safely: the admin shows the channels whose only allowed group one is as
    what keeps it, and deletes nothing (``channels_app.inventory.groups``)."""

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        for group in objs:
            alone = channels_only_allowing([group])
            if alone:
                protected = [*protected, refusal(group, alone)]
        return deleted, counts, perms_needed, protected
