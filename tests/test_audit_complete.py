"""The audit trail misses nothing (docs/architecture.md, "The audit trail"): people's sharing
limits, passwords and permissions, a channel's reload and a webhook's new secret are recorded;
who acted outlives their account; a group that is a channel's only allowed group cannot be
deleted (the channel would open to everyone); many-to-many changes read as what was added or
removed, by name."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission
from django.test import Client
from rest_framework.test import APIClient

from slotserve_base.audit_trail import row_of
from tests import factories

pytestmark = pytest.mark.django_db


def entries(model: str) -> list[Any]:
    from auditlog.models import LogEntry

    return list(LogEntry.objects.filter(content_type__model=model).order_by("timestamp", "pk"))


def superuser(name: str = "boss"):
    boss = factories.user(name, staff=True)
    boss.is_superuser = True
    boss.save()
    return boss


def admin_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_persons_sharing_limits_set_in_the_admin_are_recorded():
    from gateway.models import SharingLimits

    boss, ana = superuser(), factories.user("ana")
    sent = admin_client(boss).post(
        "/admin/gateway/sharinglimits/add/",
        {"user": ana.pk, "max_concurrent": "4", "requests_per_minute": "60", "weekly_tokens": "1000000"},
    )
    assert sent.status_code == 302, sent.content.decode()[:3000]
    limits = SharingLimits.objects.get(user=ana)
    (made,) = entries("sharinglimits")
    assert made.actor == boss and row_of(made)["via"] == "admin"
    assert made.changes_dict["weekly_tokens"][1] == "1000000"
    admin_client(boss).post(
        f"/admin/gateway/sharinglimits/{limits.pk}/change/",
        {"user": ana.pk, "max_concurrent": "4", "requests_per_minute": "60", "weekly_tokens": "9000000"},
    )
    changed = entries("sharinglimits")[-1]
    assert changed.changes_dict["weekly_tokens"] == ["1000000", "9000000"]


def test_setting_another_persons_password_is_recorded_without_its_hash():
    boss, ana = superuser(), factories.user("ana")
    before = ana.password
    sent = admin_client(boss).post(
        f"/admin/auth/user/{ana.pk}/password/",
        {"password1": "a new long secret 42", "password2": "a new long secret 42", "usable_password": "true"},
    )
    assert sent.status_code == 302, sent.content.decode()[:3000]
    ana.refresh_from_db()
    assert ana.password != before
    changed = [e for e in entries("user") if "password" in e.changes_dict and e.action == e.Action.UPDATE]
    assert len(changed) == 1 and changed[0].actor == boss
    row = row_of(changed[0])
    assert row["shown"]["password"] == ["", "password changed"]
    text = str(changed[0].changes) + str(row)
    assert ana.password not in text and before not in text
    assert ana.password.split("$")[-1] not in text  # nor any part of it


def test_permissions_given_to_a_person_or_a_group_are_recorded():
    boss, ana = superuser(), factories.user("ana")
    lab = Group.objects.create(name="lab-z")
    change_channel = Permission.objects.get(codename="change_channel")
    ana.user_permissions.add(change_channel)
    lab.permissions.add(change_channel)
    person = [e for e in entries("user") if "user_permissions" in e.changes_dict]
    group = [e for e in entries("group") if "permissions" in e.changes_dict]
    assert person and group
    shown = row_of(person[-1])["shown"]["user_permissions"]
    assert shown == ["", "added: " + str(change_channel)], shown
    del boss


def test_a_channel_reload_and_a_webhooks_new_secret_are_recorded():
    from reservations.webhooks.models import Webhook
    from reservations.webhooks.services import webhook_new_secret

    boss = superuser()
    channel = factories.channel("a100-0")
    api = APIClient()
    api.force_authenticate(boss)
    answered = api.post(f"/api/channels/{channel.pk}/reload")
    assert answered.status_code in (200, 202), answered.content
    reloads = [e for e in entries("channel") if "reload" in e.changes_dict]
    assert len(reloads) == 1 and reloads[0].actor == boss and row_of(reloads[0])["via"] == "api"
    hook = Webhook.objects.create(owner=boss, name="chat", url="https://example.org/hook", secret="whsec_old")
    webhook_new_secret(webhook=hook)
    renewed = [e for e in entries("webhook") if "secret" in e.changes_dict and e.action == e.Action.UPDATE]
    assert len(renewed) == 1
    assert row_of(renewed[0])["shown"]["secret"] == ["", "new secret"]
    assert hook.secret not in str(renewed[0].changes) and "whsec_old" not in str(renewed[0].changes)


def test_who_acted_is_kept_when_their_account_is_deleted():
    boss, ana = superuser(), factories.user("ana")
    ana.email = "ana@lab.example"
    ana.is_staff = True
    ana.save()
    channel = factories.channel("a100-0")
    api = APIClient()
    api.force_authenticate(ana)
    assert (
        api.patch(f"/api/channels/{channel.pk}/", {"approval_policy": "all"}, format="json").status_code
        == 200
    )
    ana.delete()
    api.force_authenticate(boss)
    found = api.get("/api/audit/", {"who": "ana"}).data
    assert found["count"] >= 1, found
    row = next(r for r in found["results"] if r["what"] == "channel")
    assert row["who"] == "ana" and row["email"] == "ana@lab.example"
    page = admin_client(boss).get("/audit/", {"who": "ana"}).content.decode()
    assert "a100-0" in page and "ana" in page


def test_a_channels_only_allowed_group_cannot_be_deleted():
    boss = superuser()
    lab_z = Group.objects.create(name="lab-z")
    other = Group.objects.create(name="lab-y")
    closed = factories.channel("closed-0")
    closed.allowed_groups.set([lab_z])
    shared = factories.channel("shared-0")
    shared.allowed_groups.set([lab_z, other])
    admin = admin_client(boss)
    # The admin says which channels keep it, and deletes nothing.
    page = admin.post(f"/admin/auth/group/{lab_z.pk}/delete/", {"post": "yes"})
    assert page.status_code == 200 and "closed-0" in page.content.decode()
    assert Group.objects.filter(pk=lab_z.pk).exists()
    listed = admin.post(
        "/admin/auth/group/", {"action": "delete_selected", "_selected_action": [lab_z.pk], "post": "yes"}
    )
    assert listed.status_code == 200 and "closed-0" in listed.content.decode()
    assert Group.objects.filter(pk=lab_z.pk).exists()
    # Nor through any other door.
    from django.db import transaction
    from django.db.models import ProtectedError

    with pytest.raises(ProtectedError, match="closed-0"), transaction.atomic():
        lab_z.delete()
    assert list(closed.allowed_groups.all()) == [lab_z]
    # A group that is not a channel's only one goes, and the channel's change is recorded.
    closed.allowed_groups.set([lab_z, other])
    lab_z.delete()
    assert set(shared.allowed_groups.all()) == {other}
    changes = [row_of(e)["shown"].get("allowed_groups") for e in entries("channel")]
    assert ["", "removed: lab-z"] in changes, changes
    # A member of no group is still refused on both.
    del boss


def test_many_to_many_changes_read_as_what_was_added_or_removed():
    from gateway.api_keys import api_key_create

    boss, ana = superuser(), factories.user("ana")
    lab = Group.objects.create(name="lab-x")
    ana.groups.add(lab)
    a, b = factories.channel("a100-0"), factories.channel("a100-1")
    key, _ = api_key_create(user=ana, name="nb", channels=[a])
    key.channels_allowed.clear()
    rows = [row_of(e) for e in entries("user") + entries("apikey")]
    shown = [r["shown"][name] for r in rows for name in ("groups", "channels_allowed") if name in r["shown"]]
    assert ["", "added: lab-x"] in shown, shown
    assert ["", "removed: a100-0"] in shown, shown  # what the key had, not every channel
    assert not any("a100-1" in str(s) for s in shown)
    page = admin_client(boss).get("/audit/").content.decode()
    assert "added: lab-x" in page and "[&#x27;type&#x27;" not in page and "['type'" not in page
    exported = admin_client(boss).get("/audit/csv")
    table = list(csv.DictReader(io.StringIO(b"".join(exported.streaming_content).decode())))  # type: ignore[attr-defined]
    assert any("added: lab-x" in r["changes"] for r in table)
    del b
