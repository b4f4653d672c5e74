"""Joining (docs/portal.md, "Joining" and "People and groups"): staff invite by email and the
newcomer chooses a username and password; where the lab says so people ask for an account,
confirm their address and are let in by staff or by their lab's domain; staff keep people's
groups and whether they may sign in on one page."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core import mail
from django.test import Client
from django.utils import timezone

from gateway.api_keys import api_key_create
from gateway.models import ApiKey
from reservations.models import Invitation, SignupRequest
from tests import factories
from tests.factories import client_for

People = get_user_model()
STRONG = "a long enough pass phrase"
# The mails go after each commit, as in a deployment: each request commits its own.
pytestmark = pytest.mark.django_db(transaction=True)


def signs_in(username: str, password: str) -> bool:
    """Whether the sign-in form lets ``username`` in with ``password``."""
    answer = Client().post("/accounts/login/", {"username": username, "password": password})
    return answer.status_code == 302


def _link(queued, address: str) -> str:
    """The path of the link in the last mail to ``address`` (the mail task run as a worker would)."""
    queued.run()
    sent = [m for m in mail.outbox if address in m.to]
    assert sent, [m.to for m in mail.outbox]
    found = re.search(r"https?://[^/\s]+(/\S+)|(/(?:join|signup/confirm)/\S+)", sent[-1].body)
    assert found, sent[-1].body
    return found.group(1) or found.group(2)


@pytest.fixture
def lab(db, staff, settings):
    settings.SLOTSERVE_PUBLIC_URL = "https://gpu.lab.example"
    return Group.objects.create(name="nlp")


def test_an_invited_person_chooses_a_name_and_password_joins_the_groups_and_is_signed_in(lab, staff, queued):
    page = client_for(staff)
    sent = page.post("/people/", {"invite": "1", "i-emails": "cai@uni.example\n", "i-groups": [lab.pk]})
    assert sent.status_code == 302
    link = _link(queued, "cai@uni.example")
    assert link.startswith("/join/") and mail.outbox[-1].subject == "You are invited to SlotServe"
    newcomer = Client()
    form = newcomer.get(link)
    assert form.status_code == 200 and "cai@uni.example" in form.content.decode()
    weak = newcomer.post(link, {"username": "cai", "password": "123", "password_again": "123"})
    assert weak.status_code == 400 and "too short" in weak.content.decode()
    taken = newcomer.post(link, {"username": staff.username, "password": STRONG, "password_again": STRONG})
    assert taken.status_code == 400 and "is taken" in taken.content.decode()
    joined = newcomer.post(link, {"username": "cai", "password": STRONG, "password_again": STRONG})
    assert joined.status_code == 302
    cai = People.objects.get(username="cai")
    assert cai.email == "cai@uni.example" and cai.is_active and list(cai.groups.all()) == [lab]
    assert newcomer.get("/").status_code == 200  # signed in
    again = Client().get(link)
    assert again.status_code == 410 and "used or has expired" in again.content.decode()


def test_an_invitation_expires_a_newer_one_replaces_it_and_an_address_with_an_account_is_named(
    lab, staff, ana, frozen, queued
):
    from reservations.joining import invite

    first = invite(by=staff, email="dai@uni.example", groups=[], now=timezone.now())
    first_link = _link(queued, "dai@uni.example")
    invite(by=staff, email="dai@uni.example", groups=[lab], now=timezone.now())
    assert Client().get(first_link).status_code == 410  # the newer one stands
    first.refresh_from_db()
    assert first.accepted_at is None
    newer = _link(queued, "dai@uni.example")
    frozen.shift(timedelta(days=7, seconds=1))
    assert Client().get(newer).status_code == 410
    page = client_for(staff)
    refused = page.post("/people/", {"invite": "1", "i-emails": f"{ana.email}\nnot-an-address"})
    assert refused.status_code == 400
    shown = refused.content.decode()
    assert (
        f"{ana.email} has an account already: ana" in shown
        and "&#x27;not-an-address&#x27; is not an email" in shown
    )
    assert client_for(ana).post("/people/", {"invite": "1", "i-emails": "x@uni.example"}).status_code == 403
    assert Invitation.objects.count() == 2


def test_signing_up_waits_for_the_address_then_for_staff_who_let_in_or_turn_down(
    lab, staff, settings, queued
):
    settings.SLOTSERVE_SIGNUP = "approval"
    login = Client().get("/accounts/login/").content.decode()
    assert 'id="sign-up-link"' in login
    asked = Client().post(
        "/signup/",
        {"email": "eve@else.example", "username": "eve", "password": STRONG, "password_again": STRONG},
    )
    assert asked.status_code == 200 and "a link to go on is on its way" in asked.content.decode()
    eve = People.objects.get(username="eve")
    assert not eve.is_active
    assert not signs_in("eve", STRONG)  # not before it is let in
    link = _link(queued, "eve@else.example")
    page = client_for(staff)
    early = page.post(f"/people/signups/{eve.signup.pk}/decide", {"approve": "1"})
    assert early.status_code == 302 and not People.objects.get(username="eve").is_active
    confirmed = Client().get(link).content.decode()
    assert "Staff now look at your request for eve" in confirmed
    queued.run()
    assert staff.notifications.filter(text__contains="eve (eve@else.example) asks for an account").exists()
    listed = page.get("/people/").content.decode()
    assert 'data-signup="' in listed and "(confirmed)" in listed
    page.post(f"/people/signups/{eve.signup.pk}/decide", {"approve": "1"})
    assert People.objects.get(username="eve").is_active
    assert _link(queued, "eve@else.example") == "/accounts/login/"  # "your account is ready"
    # Another is turned down with a reason: the account goes, and they are told why.
    Client().post(
        "/signup/",
        {"email": "mal@else.example", "username": "mal", "password": STRONG, "password_again": STRONG},
    )
    Client().get(_link(queued, "mal@else.example"))
    mal = SignupRequest.objects.get(user__username="mal")
    no_reason = page.post(f"/people/signups/{mal.pk}/decide", {"approve": "0", "reason": " "})
    assert no_reason.status_code == 302 and People.objects.filter(username="mal").exists()
    page.post(f"/people/signups/{mal.pk}/decide", {"approve": "0", "reason": "not in the lab"})
    queued.run()
    assert not People.objects.filter(username="mal").exists()
    assert "turned down: not in the lab" in mail.outbox[-1].body


def test_a_labs_own_domain_is_let_in_once_confirmed_and_another_is_refused(db, settings, queued, ana):
    settings.SLOTSERVE_SIGNUP, settings.SLOTSERVE_SIGNUP_DOMAINS = "domain", ["lab.example"]
    outside = Client().post(
        "/signup/", {"email": "x@else.example", "username": "x", "password": STRONG, "password_again": STRONG}
    )
    assert (
        outside.status_code == 400
        and "sign up with your lab&#x27;s address: @lab.example" in outside.content.decode()
    )
    Client().post(
        "/signup/",
        {"email": "fay@lab.example", "username": "fay", "password": STRONG, "password_again": STRONG},
    )
    ready = Client().get(_link(queued, "fay@lab.example")).content.decode()
    assert "Your account fay is ready" in ready and People.objects.get(username="fay").is_active
    assert signs_in("fay", STRONG)
    # An address that has an account: nothing is made, the page says what it says to anyone,
    # and only that address hears (with the account's name).
    ana.email = "ana@lab.example"
    ana.save()
    same = Client().post(
        "/signup/",
        {"email": "ana@lab.example", "username": "ana2", "password": STRONG, "password_again": STRONG},
    )
    assert "a link to go on is on its way" in same.content.decode() and not People.objects.filter(
        username="ana2"
    )
    queued.run()
    assert "which has one already: ana" in mail.outbox[-1].body


def test_sign_up_is_off_unless_the_lab_turns_it_on(db):
    assert Client().get("/signup/").status_code == 404
    assert 'id="sign-up-link"' not in Client().get("/accounts/login/").content.decode()


def test_staff_keep_peoples_groups_and_who_may_sign_in_and_a_stopped_persons_keys_stop(lab, staff, ana):
    api_key_create(user=ana, name="k")
    page = client_for(staff)
    listed = page.get("/people/", {"q": "ana"}).content.decode()
    assert 'data-person="ana"' in listed and 'data-person="admin"' not in listed.replace(
        staff.username, "admin"
    )
    page.post(f"/people/{ana.pk}/change", {"groups": [lab.pk]})  # "active" unticked: stopped
    ana.refresh_from_db()
    assert list(ana.groups.all()) == [lab] and not ana.is_active
    assert not ApiKey.objects.usable().filter(user=ana).exists()
    page.post(f"/people/{ana.pk}/change", {"groups": [], "active": "on"})
    ana.refresh_from_db()
    assert ana.is_active and not ana.groups.exists()
    page.post(f"/people/{staff.pk}/change", {"groups": []})  # one's own: refused, named
    staff.refresh_from_db()
    assert staff.is_active
    made = page.post("/people/", {"group": "1", "g-name": "vision"})
    assert made.status_code == 302 and Group.objects.filter(name="vision").exists()
    assert page.post("/people/", {"group": "1", "g-name": "NLP"}).status_code == 400  # exists, in any case
    member = client_for(factories.user("bo2"))
    assert member.get("/people/").status_code == 403
    assert member.post(f"/people/{ana.pk}/change", {"groups": [], "active": "on"}).status_code == 403
