"""Joining and people (docs/portal.md, "Joining" and "People and groups"): the invitation's and
the sign-up's pages for newcomers, and staff's page of people, groups, invitations and sign-ups
(``reservations.joining`` decides)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.contrib.auth.models import Group
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from portal.actions import me, staff_only
from portal.forms import AccountForm, GroupForm, InviteForm, SignupForm
from reservations import joining
from reservations.models import Invitation, SignupRequest
from slotserve_base.errors import InvalidInput

WHAT = "People and groups"
# People a page of the people list shows.
PEOPLE_PAGE = 50
# The session's sign-in backend for a newcomer signed in at once (the local accounts').
LOCAL_ACCOUNTS = "django.contrib.auth.backends.ModelBackend"


def _refused(form: Any, problem: InvalidInput) -> None:
    form.add_error(problem.field if problem.field in form.fields else None, problem.message)


def join(request: HttpRequest, token: str) -> HttpResponse:
    """An invitation's link: the newcomer chooses a username and password and is signed in."""
    invitation = joining.invitation_for(token, timezone.now())
    if invitation is None:
        return render(request, "portal/join.html", {"gone": True}, status=410)
    form = AccountForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            person = joining.accept_invitation(
                token=token,
                username=form.cleaned_data["username"],
                password=form.cleaned_data["password"],
                now=timezone.now(),
            )
        except InvalidInput as problem:
            if problem.field == "token":
                return render(request, "portal/join.html", {"gone": True}, status=410)
            _refused(form, problem)
        else:
            login(request, person, backend=LOCAL_ACCOUNTS)
            messages.success(
                request, f"Welcome, {person.username}. Book a slot, or try a model in the playground."
            )
            return redirect("portal:overview")
    status = 400 if request.method == "POST" else 200
    return render(request, "portal/join.html", {"form": form, "invitation": invitation}, status=status)


def signup(request: HttpRequest) -> HttpResponse:
    """The sign-up page, where the lab turns it on (``SLOTSERVE_SIGNUP``)."""
    if settings.SLOTSERVE_SIGNUP == "off":
        raise Http404("this SlotServe's accounts are made by staff")
    form = SignupForm(request.POST or None)
    context: dict[str, Any] = {
        "form": form,
        "domains": settings.SLOTSERVE_SIGNUP_DOMAINS,
        "mode": settings.SLOTSERVE_SIGNUP,
    }
    if request.method == "POST" and form.is_valid():
        given = form.cleaned_data
        try:
            joining.sign_up(
                username=given["username"],
                email=given["email"],
                password=given["password"],
                now=timezone.now(),
            )
        except InvalidInput as problem:
            _refused(form, problem)
        else:
            # The same words whether or not the address had an account: it is told by email.
            return render(request, "portal/signup.html", {**context, "sent_to": given["email"]})
    return render(request, "portal/signup.html", context, status=400 if request.method == "POST" else 200)


def confirm(request: HttpRequest, token: str) -> HttpResponse:
    """A sign-up's link: the address is confirmed, and the page says what comes next."""
    try:
        asked = joining.confirm_email(token=token, now=timezone.now())
    except InvalidInput as problem:
        return render(request, "portal/signup.html", {"problem": problem.message}, status=410)
    return render(request, "portal/signup.html", {"confirmed": asked})


@staff_only(WHAT)
def people(request: HttpRequest) -> HttpResponse:
    """Staff's page: sign-ups waiting, invitations, people (their groups, whether they may sign
    in) and groups. A POST with ``invite`` or ``group`` makes them."""
    invite, group = InviteForm(prefix="i"), GroupForm(prefix="g")
    status = 200
    if request.method == "POST" and "invite" in request.POST:
        invite = InviteForm(request.POST, prefix="i")
        if invite.is_valid():
            made, refused = [], []
            for email in invite.cleaned_data["emails"]:
                try:
                    joining.invite(
                        by=me(request), email=email, groups=invite.cleaned_data["groups"], now=timezone.now()
                    )
                    made.append(email)
                except InvalidInput as problem:
                    refused.append(problem.message)
            if made:
                messages.success(request, f"Invited {', '.join(made)}: each gets a link by email.")
            for why in refused:
                messages.error(request, why)
            if not refused:
                return redirect("portal:people")
        status = 400
    elif request.method == "POST" and "group" in request.POST:
        group = GroupForm(request.POST, prefix="g")
        if group.is_valid():
            try:
                made_group = joining.group_create(name=group.cleaned_data["name"], by=me(request))
            except InvalidInput as problem:
                _refused(group, problem)
            else:
                messages.success(request, f"Group {made_group.name} made.")
                return redirect("portal:people")
        status = 400
    now = timezone.now()
    query = request.GET.get("q", "").strip()[:150]
    listed = get_user_model().objects.order_by("username").prefetch_related("groups")
    if query:
        listed = listed.filter(
            Q(username__icontains=query) | Q(email__icontains=query) | Q(groups__name__iexact=query)
        ).distinct()
    page = Paginator(listed, PEOPLE_PAGE).get_page(request.GET.get("page"))
    context = {
        "invite_form": invite,
        "group_form": group,
        "signups": SignupRequest.objects.filter(decided_at__isnull=True)
        .select_related("user")
        .order_by("created"),
        "invitations": Invitation.objects.filter(accepted_at__isnull=True, expires_at__gt=now)
        .select_related("invited_by")
        .prefetch_related("groups"),
        "people": page,
        "groups": Group.objects.annotate(members=Count("user")).order_by("name"),
        "all_groups": list(Group.objects.order_by("name")),
        "q": query,
        "signup_mode": settings.SLOTSERVE_SIGNUP,
    }
    return render(request, "portal/people.html", context, status=status)


@require_POST
@staff_only(WHAT)
def person_change(request: HttpRequest, pk: int) -> HttpResponse:
    person = get_object_or_404(get_user_model(), pk=pk)
    wanted = Group.objects.filter(pk__in=[v for v in request.POST.getlist("groups") if v.isdigit()])
    try:
        joining.person_set_groups(person=person, groups=list(wanted), by=me(request))
        joining.person_set_active(person=person, active=request.POST.get("active") == "on", by=me(request))
    except InvalidInput as problem:
        messages.error(request, f"{person.username}: {problem.message}")
        return redirect("portal:people")
    messages.success(request, f"{person.username} saved.")
    return redirect("portal:people")


@require_POST
@staff_only(WHAT)
def signup_decide(request: HttpRequest, pk: int) -> HttpResponse:
    asked = get_object_or_404(SignupRequest.objects.select_related("user"), pk=pk)
    who, approve = asked.user.username, request.POST.get("approve") == "1"
    try:
        joining.decide_signup(
            asked=asked,
            by=me(request),
            approve=approve,
            reason=request.POST.get("reason", ""),
            now=timezone.now(),
        )
    except InvalidInput as problem:
        messages.error(request, problem.message)
    else:
        messages.success(request, f"{who} {'let in' if approve else 'turned down'}.")
    return redirect("portal:people")
