"""Joining SlotServe (docs/portal.md, "Joining"): staff invite people by email, and, where the
lab turns it on (``SLOTSERVE_SIGNUP``), people sign themselves up: their address confirmed by a
link first, then approved by staff (``approval``) or let in for an address of the lab's own
(``domain``, ``SLOTSERVE_SIGNUP_DOMAINS``).

Links carry a token that is kept only hashed, works once and, for an invitation, until it
expires. A sign-up for an address that already has an account makes nothing and tells that
address so (the page says the same to everyone, so it tells nobody which addresses have one).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Collection
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model, password_validation
from django.contrib.auth.models import Group, User
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction

from reservations.models import Invitation, SignupRequest
from reservations.notifications import notify
from slotserve_base import dispatch
from slotserve_base.errors import InvalidInput
from slotserve_base.public_url import public_url
from slotserve_base.vocabulary import NotificationEvent


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _mail(to: str, subject: str, body: str) -> None:
    """Sent after the commit by the notification mail's task (retried; a slow mail server
    never holds the page)."""
    transaction.on_commit(lambda: dispatch.send(dispatch.NOTIFICATION_EMAIL, args=(to, subject, body)))


def _link(path: str) -> str:
    return public_url(path) or path


def _email(value: str) -> str:
    email = value.strip()
    try:
        validate_email(email)
    except ValidationError:
        raise InvalidInput("email", f"{email!r} is not an email address") from None
    return email


def _new_person(*, username: str, email: str, password: str, active: bool) -> User:
    """An account, every rule of a username and a password checked first, each named."""
    username = username.strip()
    try:
        UnicodeUsernameValidator()(username)
    except ValidationError:
        raise InvalidInput("username", "letters, digits and @ . + - _ only") from None
    if not username or len(username) > 150:
        raise InvalidInput("username", "between 1 and 150 characters")
    people = get_user_model().objects
    if people.filter(username__iexact=username).exists():
        raise InvalidInput("username", f"{username!r} is taken; choose another")
    try:
        password_validation.validate_password(password, User(username=username, email=email))
    except ValidationError as refused:
        raise InvalidInput("password", " ".join(refused.messages)) from None
    try:
        with transaction.atomic():
            return people.create_user(username=username, email=email, password=password, is_active=active)
    except IntegrityError:  # the same name, made meanwhile
        raise InvalidInput("username", f"{username!r} is taken; choose another") from None


def has_account(email: str) -> User | None:
    return get_user_model().objects.filter(email__iexact=email).order_by("pk").first()


def invite(*, by: User, email: str, groups: Collection[Group], now: datetime) -> Invitation:
    """Ask ``email`` to join, into ``groups``; an earlier invitation of the address still
    waiting stops working. Mailed after the commit."""
    if not by.is_staff:
        raise PermissionDenied("only staff invite people")
    email = _email(email)
    existing = has_account(email)
    if existing is not None:
        raise InvalidInput("email", f"{email} has an account already: {existing.username}")
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        Invitation.objects.filter(email__iexact=email, accepted_at__isnull=True, expires_at__gt=now).update(
            expires_at=now
        )
        invitation = Invitation.objects.create(
            email=email,
            token_hash=_hash(token),
            invited_by=by,
            created=now,
            expires_at=now + timedelta(days=settings.SLOTSERVE_INVITATION_DAYS),
        )
        invitation.groups.set(groups)
        _mail(
            email,
            "You are invited to SlotServe",
            f"{by.get_full_name() or by.username} invites you to SlotServe, where the lab books its GPUs.\n\n"
            f"Choose your username and password here (the link works once, for "
            f"{settings.SLOTSERVE_INVITATION_DAYS} days):\n{_link(f'/join/{token}')}\n",
        )
    return invitation


def invitation_for(token: str, now: datetime) -> Invitation | None:
    """The invitation ``token`` opens: not yet taken, not expired."""
    return (
        Invitation.objects.filter(token_hash=_hash(token), accepted_at__isnull=True, expires_at__gt=now)
        .select_related("invited_by")
        .first()
    )


def accept_invitation(*, token: str, username: str, password: str, now: datetime) -> User:
    """The invited person's account, active at once, in the invitation's groups; the link
    works once (two tabs sending it at once make one account)."""
    with transaction.atomic():
        invitation = (
            Invitation.objects.select_for_update()
            .filter(token_hash=_hash(token), accepted_at__isnull=True, expires_at__gt=now)
            .first()
        )
        if invitation is None:
            raise InvalidInput("token", "this invitation has been used or has expired; ask staff for another")
        person = _new_person(username=username, email=invitation.email, password=password, active=True)
        person.groups.set(invitation.groups.all())
        invitation.accepted_by, invitation.accepted_at = person, now
        invitation.save(update_fields=["accepted_by", "accepted_at"])
    return person


def _domain_of(email: str) -> str:
    return email.rsplit("@", 1)[-1].lower()


def sign_up(*, username: str, email: str, password: str, now: datetime) -> SignupRequest | None:
    """Someone asks for an account: made inactive, with a link to confirm the address. For an
    address that has an account already: nothing made, and that address is told (None)."""
    mode = settings.SLOTSERVE_SIGNUP
    if mode == "off":
        raise PermissionDenied("this SlotServe's accounts are made by staff; ask one of them")
    email = _email(email)
    domains = settings.SLOTSERVE_SIGNUP_DOMAINS
    if mode == "domain" and _domain_of(email) not in domains:
        raise InvalidInput("email", "sign up with your lab's address: " + ", ".join(f"@{d}" for d in domains))
    existing = has_account(email)
    if existing is not None:
        with transaction.atomic():
            _mail(
                email,
                "Your SlotServe account",
                f"Someone asked for a SlotServe account for this address, which has one already: "
                f"{existing.username}.\nSign in, or choose a new password here: "
                f"{_link('/accounts/password_reset/')}\n"
                "If it was not you, there is nothing to do.",
            )
        return None
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        person = _new_person(username=username, email=email, password=password, active=False)
        asked = SignupRequest.objects.create(user=person, token_hash=_hash(token), created=now)
        _mail(
            email,
            "Confirm your address for SlotServe",
            f"Confirm that this address is yours to go on with your SlotServe account {person.username}:\n"
            f"{_link(f'/signup/confirm/{token}')}\n"
            + ("Staff then approve it; you are told by email.\n" if mode == "approval" else ""),
        )
    return asked


def confirm_email(*, token: str, now: datetime) -> SignupRequest:
    """The address is the asker's: the account is let in (``domain``), or waits for staff, who
    are told (``approval``)."""
    with transaction.atomic():
        asked = (
            SignupRequest.objects.select_for_update()
            .select_related("user")
            .filter(token_hash=_hash(token), decided_at__isnull=True)
            .first()
        )
        if asked is None:
            raise InvalidInput("token", "this link has been used or is not one of ours")
        if asked.email_confirmed_at is not None:
            return asked
        asked.email_confirmed_at = now
        asked.save(update_fields=["email_confirmed_at"])
        if settings.SLOTSERVE_SIGNUP == "domain":
            _let_in(asked, by=None, now=now)
        else:
            for approver in get_user_model().objects.filter(is_staff=True, is_active=True):
                notify(
                    user=approver,
                    event=NotificationEvent.SUBMITTED,
                    text=f"{asked.user.username} ({asked.user.email}) asks for an account.",
                    link="/people/#sign-ups",
                    key=f"signup:{asked.pk}",
                )
    return asked


def _let_in(asked: SignupRequest, *, by: User | None, now: datetime) -> None:
    person = asked.user
    person.is_active = True
    person.save(update_fields=["is_active"])
    asked.decided_at, asked.decided_by = now, by
    asked.save(update_fields=["decided_at", "decided_by"])
    _mail(
        person.email,
        "Your SlotServe account is ready",
        f"Your account {person.username} is ready: sign in at {_link('/accounts/login/')}\n",
    )


def decide_signup(*, asked: SignupRequest, by: User, approve: bool, reason: str, now: datetime) -> None:
    """Staff let a confirmed sign-up in, or turn it down (the account goes; the asker is told,
    with the reason)."""
    if not by.is_staff:
        raise PermissionDenied("only staff approve sign-ups")
    with transaction.atomic():
        asked = SignupRequest.objects.select_for_update().select_related("user").get(pk=asked.pk)
        if asked.decided_at is not None:
            raise InvalidInput("signup", f"{asked.user.username}'s sign-up was decided already")
        if asked.email_confirmed_at is None:
            raise InvalidInput("signup", f"{asked.user.username} has not confirmed their address yet")
        if approve:
            _let_in(asked, by=by, now=now)
            return
        if not reason.strip():
            raise InvalidInput("reason", "say why, for the person asking")
        _mail(
            asked.user.email,
            "Your SlotServe sign-up",
            f"Your request for the SlotServe account {asked.user.username} was turned down: "
            f"{reason.strip()}\n",
        )
        person = asked.user
        asked.delete()  # first: the trail reads whom it was for while that person still exists
        person.delete()


def person_set_groups(*, person: User, groups: Collection[Group], by: User) -> None:
    """Staff put a person in exactly ``groups`` (the audit trail keeps each change)."""
    if not by.is_staff:
        raise PermissionDenied("only staff change people's groups")
    person.groups.set(groups)


def person_set_active(*, person: User, active: bool, by: User) -> None:
    """Staff let a person sign in, or stop them (their bookings and keys stay as they are; a
    stopped person's keys are refused with their account)."""
    if not by.is_staff:
        raise PermissionDenied("only staff stop or let in people")
    if person.pk == by.pk and not active:
        raise InvalidInput("active", "you cannot stop your own account; ask another staff member")
    if person.is_active != active:
        person.is_active = active
        person.save(update_fields=["is_active"])


def group_create(*, name: str, by: User) -> Group:
    if not by.is_staff:
        raise PermissionDenied("only staff make groups")
    name = name.strip()
    if not name or len(name) > 150:
        raise InvalidInput("name", "a group's name is 1 to 150 characters")
    if Group.objects.filter(name__iexact=name).exists():
        raise InvalidInput("name", f"there is a group {name!r} already")
    return Group.objects.create(name=name)
