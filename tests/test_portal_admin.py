"""The admin and the inventory's forms as staff meet them (docs/portal.md): memory in GiB, a GPU's
indexes and labels as plain fields, a new person's email and groups."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from tests import factories
from tests.factories import client_for


@pytest.mark.django_db(transaction=True)
def test_memory_is_entered_and_shown_with_its_unit_in_gib():
    from slotserve_base.admin_fields import MemoryField

    field = MemoryField()
    assert field.clean("80 GiB") == 80 * 2**30
    assert field.clean("80GiB") == field.clean("80") == 80 * 2**30  # a bare number is GiB
    assert field.clean("1.5 TiB") == int(1.5 * 2**40)
    assert field.clean("512 MiB") == 512 * 2**20
    assert field.clean("80 GB") == 80 * 10**9  # the decimal unit, as written
    assert field.prepare_value(80 * 2**30) == "80 GiB"
    assert field.prepare_value(80 * 10**9) == "74.51 GiB"
    # A model under a GiB is not "0 GiB": it is told in the unit that says its size.
    from slotserve_base.admin_fields import gib

    assert [gib(n) for n in (3 * 2**20, 512 * 2**20, 1536, 2**30)] == ["3 MiB", "512 MiB", "1.5 KiB", "1 GiB"]
    for wrong, said in (("80000000000", "GiB"), ("eighty", "80 GiB"), ("-1 GiB", "80 GiB")):
        with pytest.raises(ValidationError) as caught:
            field.clean(wrong)
        assert said in str(caught.value), (wrong, caught.value)


@pytest.mark.django_db(transaction=True)
def test_the_admin_takes_a_gpus_memory_in_gib_and_the_portal_shows_gib():
    staff = factories.user("boss", staff=True)
    staff.is_superuser = True
    staff.save()
    node = factories.node("gpu-1", memory=80 * 10**9)
    factories.channel("a100-0", on=node)
    client = Client()
    client.force_login(staff)
    form = client.get(f"/admin/channels_app/node/{node.pk}/change/").content.decode()
    assert 'value="74.51 GiB"' in form
    overview = client.get("/").content.decode()
    assert "74.51 GiB" in overview and " GB" not in overview


@pytest.mark.django_db(transaction=True)
def test_adding_a_person_in_the_admin_asks_their_email_and_groups_and_a_user_without_one_is_flagged():
    from django.contrib.auth.models import Group, User

    root = factories.user("root", staff=True, is_superuser=True)
    vision = Group.objects.create(name="vision")
    admin = Client()
    admin.force_login(root)
    form = admin.get("/admin/auth/user/add/").content.decode()
    assert 'name="email"' in form and 'name="groups"' in form
    answer = admin.post(
        "/admin/auth/user/add/",
        {
            "username": "cy",
            "email": "cy@lab.example",
            "groups": [vision.pk],
            "password1": "a-long-pass-phrase-9",
            "password2": "a-long-pass-phrase-9",
            "usable_password": "true",
        },
    )
    assert answer.status_code == 302, answer.content.decode()[:3000]
    cy = User.objects.get(username="cy")
    assert cy.email == "cy@lab.example" and list(cy.groups.all()) == [vision]
    silent = factories.user("dee")
    silent.email = ""
    silent.save()
    page = admin.get(f"/admin/auth/user/{silent.pk}/change/").content.decode()
    assert "has no email" in page
    assert "has no email" not in admin.get(f"/admin/auth/user/{cy.pk}/change/").content.decode()


@pytest.mark.django_db
def test_gpu_indexes_and_labels_are_plain_fields_in_the_admin(db):
    from django.contrib.auth import get_user_model

    from channels_app.models import Channel

    boss = get_user_model().objects.create_superuser("boss", "boss@example.org", "pw")
    node = factories.node("n1", gpus=2)
    client = client_for(boss)
    page = client.get("/admin/channels_app/channel/add/").content.decode()
    assert 'name="gpu_indexes"' in page and 'type="text"' in page
    base = {
        "name": "a100-0",
        "node": node.pk,
        "approval_policy": "none",
        "min_booking_minutes": 0,
        "allow_whole_card": "on",
    }
    bad = client.post("/admin/channels_app/channel/add/", {**base, "gpu_indexes": "0, x", "labels": ""})
    assert "&#x27;x&#x27; is not a GPU index" in bad.content.decode()
    worse = client.post(
        "/admin/channels_app/channel/add/", {**base, "gpu_indexes": "0", "labels": "gpu a100"}
    )
    assert "line 1: write key=value" in worse.content.decode()
    made = client.post(
        "/admin/channels_app/channel/add/",
        {**base, "gpu_indexes": "0, 1", "labels": "gpu=a100\nzone = lab-1"},
    )
    assert made.status_code == 302, made.content.decode()[:2000]
    channel = Channel.objects.get(name="a100-0")
    assert channel.gpu_indexes == [0, 1] and channel.labels == {"gpu": "a100", "zone": "lab-1"}
    shown = client.get(f"/admin/channels_app/channel/{channel.pk}/change/").content.decode()
    assert 'value="0, 1"' in shown and "gpu=a100\nzone=lab-1" in shown
