"""One's own pages (docs/portal.md): API keys and their snippets, notifications, the settings'
time zone."""

from __future__ import annotations

from datetime import datetime, time, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from reservations.models import Notification, Profile
from reservations.notifications import notify
from reservations.profiles import profile_for
from tests import factories
from tests.conftest import serve
from tests.factories import client_for


def _year(day: Any) -> str:
    return f" {day.year}" if day.year != timezone.now().year else ""


@pytest.mark.django_db(transaction=True)
def test_a_keys_expiry_is_shown_as_it_was_asked_the_last_day_it_works():
    import zoneinfo

    from reservations.wording import expiry_words

    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    ana = factories.user("ana")
    profile = profile_for(ana)
    profile.time_zone, profile.time_zone_chosen = "Europe/Berlin", True
    profile.save()
    client = Client()
    client.force_login(ana)
    last = (timezone.now() + timedelta(days=40)).astimezone(berlin).date()
    made = client.post("/keys/", {"name": "ci", "wait_seconds": 0, "expires": last.isoformat()})
    assert made.status_code == 200, made.content
    page = client.get("/keys/").content.decode()
    said = f"last day it works: {last:%a} {last.day} {last:%b}"
    assert said in page, page[page.index("ci") : page.index("ci") + 400]
    after = last + timedelta(days=1)
    assert f"{after.day} {after:%b}" not in page
    # A moment not at midnight (set through the API) is said as a moment.

    odd = datetime.combine(last, time(14, 30), tzinfo=berlin)
    assert expiry_words(odd, berlin) == f"works until {last:%a} {last.day} {last:%b}{_year(last)} 14:30 CET"


@pytest.mark.django_db(transaction=True)
def test_the_keys_page_gives_the_base_url_ready_snippets_and_a_copy_button(settings):
    settings.SLOTSERVE_PUBLIC_URL = "https://gpu.lab.example"
    ana = factories.user("ana")
    client = Client()
    client.force_login(ana)
    page = client.post("/keys/", {"name": "notebook", "wait_seconds": 0}).content.decode()
    assert "https://gpu.lab.example/v1" in page
    assert "curl https://gpu.lab.example/v1/chat/completions" in page
    assert 'base_url="https://gpu.lab.example/v1"' in page  # Python's openai client
    assert 'data-copy="new-key"' in page
    key = page.split('id="new-key">')[1].split("<")[0]
    assert key.startswith("ss-") and f'api_key="{key}"' in page  # the snippets carry the new key


@pytest.mark.django_db(transaction=True)
def test_opening_notifications_marks_them_read_and_shows_which_were_new():

    ana = factories.user("ana")
    notify(user=ana, event="approved", text="a100-0: your booking is approved.", link="/", key="k1")
    client = Client()
    client.force_login(ana)
    assert Notification.objects.filter(user=ana, read=False).count() == 1
    first = client.get("/notifications/").content.decode()
    assert "your booking is approved" in first and 'class="new"' in first
    assert not Notification.objects.filter(user=ana, read=False).exists()
    assert 'class="new"' not in client.get("/notifications/").content.decode()


@pytest.mark.django_db
def test_the_browsers_zone_is_taken_at_first_and_never_over_a_choice(ana):
    client = client_for(ana)
    assert profile_for(ana).time_zone_chosen is False
    taken = client.post("/settings/time-zone", {"time_zone": "Europe/Berlin", "detected": "1"})
    assert taken.json() == {"time_zone": "Europe/Berlin", "changed": True}
    again = client.post("/settings/time-zone", {"time_zone": "Asia/Tokyo", "detected": "1"})
    assert again.json() == {"time_zone": "Europe/Berlin", "changed": False}, "detection never overrides"
    chosen = client.post("/settings/time-zone", {"time_zone": "Asia/Tokyo"})  # the offer, accepted
    assert chosen.json() == {"time_zone": "Asia/Tokyo", "changed": True}
    bad = client.post("/settings/time-zone", {"time_zone": "Mars/Olympus"})
    assert bad.status_code == 400 and bad.json()["field"] == "time_zone"
    assert "'Mars/Olympus' is not a time zone" in bad.json()["message"]
    assert profile_for(ana).time_zone == "Asia/Tokyo"
    page = client.get("/").content.decode()
    assert 'id="nav-zone">Asia/Tokyo<' in page


@pytest.mark.django_db
def test_a_persons_zone_ends_with_their_request(ana, settings):
    """A page is shown in its reader's zone, and only that page: the next piece of work on the
    same thread (another person's websocket, a task) starts in the site's zone."""
    profile = profile_for(ana)
    profile.time_zone = "Asia/Tokyo"
    profile.save()
    assert 'id="nav-zone">Asia/Tokyo<' in client_for(ana).get("/").content.decode()
    assert timezone.get_current_timezone_name() == settings.TIME_ZONE


def test_preferences_and_keys_pages(portal, ana):
    client = client_for(ana)
    saved = client.post("/settings/", {"time_zone": "Asia/Shanghai", "email_approved": "on"})
    assert saved.status_code == 302
    profile = Profile.objects.get(user=ana)
    assert profile.time_zone == "Asia/Shanghai"
    assert profile.wants_email("approved") and not profile.wants_email("rejected")
    assert profile.calendar_token in client.get("/settings/").content.decode()
    made = client.post("/keys/", {"name": "notebook"}).content.decode()
    assert 'id="new-key">ss-' in made
    assert 'id="new-key"' not in client.get("/keys/").content.decode()


def _snippet_model(page: str) -> str:
    snippet = page[page.index('id="python-snippet"') :]
    return snippet.split('model="', 1)[1].split('"', 1)[0]


@pytest.mark.django_db
def test_the_keys_snippets_call_a_model_the_person_may_call_now(ana, bo):
    """Not the alphabetically first model (here loaded nowhere) nor one outside the new key's
    scope or on a channel booked by another: one that answers; where none does, they say why."""
    factories.llm("aaa-nowhere")
    zeta, other = factories.llm("zeta"), factories.llm("other")
    open_channel, booked = factories.channel("a100-0"), factories.channel("a100-1")
    client = client_for(ana)
    nothing = client.get("/keys/").content.decode()
    assert _snippet_model(nothing) == "MODEL"
    assert "no model is loaded on any channel right now" in nothing
    serve(open_channel, zeta, 9001)
    serve(booked, other, 9002)
    now = timezone.now()
    factories.reservation(
        owner=bo,
        on=booked,
        start=now - timedelta(minutes=5),
        end=now + timedelta(hours=1),
        target=factories.preset(other),
    )
    page = client.get("/keys/").content.decode()
    assert _snippet_model(page) == "zeta" and 'id="no-model-now"' not in page
    # A new key limited to the model of bo's slot under way: nothing it may call now, and why.
    made = client.post("/keys/", {"name": "ci", "wait_seconds": 0, "models": [other.pk]}).content.decode()
    assert 'id="new-key"' in made
    assert _snippet_model(made) == "MODEL"
    assert "no model this key may call is loaded on a channel you may use now" in made


@pytest.mark.django_db
def test_a_person_sets_their_own_email_in_settings_and_a_wrong_one_is_named(ana):
    """The first admin is made without an email, members are made by staff: each sets where
    SlotServe's mails go, and the page says when there is nowhere."""
    ana.email = ""
    ana.save()
    client = client_for(ana)
    page = client.get("/settings/").content.decode()
    assert 'name="email"' in page and "no email" in page
    kept = {"time_zone": "UTC", "email": "ana@lab.example"}
    assert client.post("/settings/", kept).status_code == 302
    ana.refresh_from_db()
    assert ana.email == "ana@lab.example"
    wrong = client.post("/settings/", {**kept, "email": "ana at lab"})
    assert wrong.status_code == 200 and "Enter a valid email address" in wrong.content.decode()
    ana.refresh_from_db()
    assert ana.email == "ana@lab.example"  # nothing half-saved
    # The service refuses it by name too, whatever door calls it.
    from reservations.profiles import profile_set_week_start, user_set_email
    from slotserve_base.errors import InvalidInput

    for bad, field in (
        (lambda: user_set_email(ana, "ana at lab"), "email"),
        (lambda: profile_set_week_start(ana, 7), "week_start"),
    ):
        with pytest.raises(InvalidInput) as refused:
            bad()
        assert refused.value.field == field, refused.value.message
