"""What a lab's first day with the portal met (docs/portal.md): a way past the navigation by
keyboard, an icon for the tab, navigation on one line, emails told apart by their subjects and
carrying a link on the one-command start, one demo key however often SlotServe starts."""

from __future__ import annotations

from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core import mail
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone

from gateway.models import ApiKey
from reservations.models import Reservation, ReservationStatus
from reservations.notifications import notify
from reservations.profiles import profile_for
from reservations.services import reservation_approve
from tests import factories
from tests.test_browser import CHROMIUM, browser, shot, sign_in  # noqa: F401  (browser: a fixture)

pytestmark = pytest.mark.django_db(transaction=True)
needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Chromium (apt-get install chromium)"
)


@needs_chromium
def test_a_skip_link_leads_past_the_navigation_to_the_content_and_the_calendars_first_lane(
    browser,  # noqa: F811
    live_server,
):
    factories.user("ana")
    channel = factories.channel("a100-0")
    page = sign_in(browser, live_server, "ana")
    missing: list[str] = []
    page.on("response", lambda answer: missing.append(answer.url) if answer.status == 404 else None)
    page.goto(f"{live_server.url}/calendar/")
    # The first Tab from the top of the page reaches "Skip to the content", shown while focused.
    page.keyboard.press("Tab")
    focused = page.evaluate(
        "[document.activeElement.textContent, document.activeElement.getAttribute('href')]"
    )
    assert focused == ["Skip to the content", "#main"], focused
    box = page.locator("a.skip-link").first.bounding_box()
    assert box is not None and box["x"] >= 0 and box["y"] >= 0
    # The second goes to the first lane: one Enter, and the lane has the keyboard.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to the calendar's lanes"
    page.keyboard.press("Enter")
    lane = page.locator(f'.timeline[data-channel-id="{channel.pk}"]').first
    assert lane.evaluate("e => e === document.activeElement")
    # "Skip to the content" puts the next Tab inside the page's own content.
    page.goto(f"{live_server.url}/book/")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    assert page.evaluate("!!document.activeElement.closest('main')")
    assert page.evaluate("!document.activeElement.closest('nav')")
    # No page asks for something that is not there (the tab's icon included).
    assert missing == [], missing


@needs_chromium
def test_the_staff_navigation_is_one_line_at_1366_pixels(browser, live_server):  # noqa: F811
    boss = factories.user("administrator", staff=True)
    profile = profile_for(boss)
    profile.time_zone, profile.time_zone_chosen = "America/New_York", True
    profile.save()
    ana = factories.user("ana")
    start = timezone.now() + timedelta(days=1)
    for n in range(12):  # a count beside Approvals and Notifications
        factories.reservation(
            owner=ana,
            on=factories.channel(f"a100-{n}"),
            start=start,
            end=start + timedelta(hours=1),
            status=ReservationStatus.PENDING,
        )
        notify(user=boss, event="submitted", text=f"news {n}")
    page = sign_in(browser, live_server, "administrator", width=1366, height=768)
    tops = page.evaluate(
        "[...document.querySelectorAll('#nav a, #nav button')].filter(e => e.getClientRects().length)"
        ".map(e => e.getBoundingClientRect().top)"
    )
    shot(page, "nav-staff-1366")
    assert len(tops) > 10 and max(tops) - min(tops) < 10, tops


def test_the_tab_icon_is_served_and_named_on_every_page():
    client = Client()
    client.force_login(factories.user("ana"))
    page = client.get("/").content.decode()
    assert '<link rel="icon" href="/static/portal/slotserve.svg" type="image/svg+xml">' in page
    icon = client.get("/static/portal/slotserve.svg")
    assert icon.status_code == 200 and icon["content-type"] == "image/svg+xml"
    assert b"<svg" in b"".join(icon.streaming_content)  # type: ignore[attr-defined]
    # Programs that ask for /favicon.ico without reading the page are sent to it.
    old = Client().get("/favicon.ico")
    assert old.status_code == 301 and old["location"] == "/static/portal/slotserve.svg"


def test_emails_name_the_channel_and_the_time_in_their_subject(django_capture_on_commit_callbacks):
    staff = factories.user("boss", staff=True)
    ana = factories.user("ana")
    channels = [factories.channel("a100-0"), factories.channel("a100-1")]
    start = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(days=1)
    made = [
        factories.reservation(
            owner=ana,
            on=channels[0],
            start=start,
            end=start + timedelta(hours=2),
            status=ReservationStatus.PENDING,
        ),
        factories.reservation(
            owner=ana,
            on=channels[1],
            start=start,
            end=start + timedelta(hours=2),
            status=ReservationStatus.PENDING,
        ),
        factories.reservation(
            owner=ana,
            on=channels[0],
            start=start + timedelta(hours=3),
            end=start + timedelta(hours=4),
            status=ReservationStatus.PENDING,
        ),
    ]
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        for booking in made:
            reservation_approve(reservation=booking, by=staff, now=timezone.now())
    subjects = [str(m.subject) for m in mail.outbox if ana.email in m.to]
    assert len(subjects) == 3 and len(set(subjects)) == 3, subjects
    for subject, booking in zip(subjects, made, strict=True):
        local = timezone.localtime(booking.start)  # its own day: the third may begin after midnight
        assert subject.startswith("[SlotServe] approved: "), subject
        assert booking.channel.name in subject, subject
        assert f"{local:%H:%M}" in subject
        assert f"{local.day} {local:%b}" in subject


def test_the_one_command_start_links_emails_to_the_address_it_serves_unless_told_another(monkeypatch):
    from slotserve_site.management.commands.run import default_public_url

    assert default_public_url("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    assert default_public_url("::1", 8080) == "http://[::1]:8080"
    everywhere = default_public_url("0.0.0.0", 8000)
    assert everywhere.startswith("http://") and "0.0.0.0" not in everywhere  # the machine's name


def test_each_start_of_the_demo_does_not_make_another_key():
    from slotserve_site.demo import demo_key

    admin = factories.user("admin", staff=True)
    first = demo_key(admin)
    assert first is not None and ApiKey.objects.filter(user=admin).count() == 1
    assert demo_key(admin) is None  # said at the first start; not made again
    assert ApiKey.objects.filter(user=admin).count() == 1


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
    for wrong, said in (("80000000000", "GiB"), ("eighty", "80 GiB"), ("-1 GiB", "80 GiB")):
        with pytest.raises(ValidationError) as caught:
            field.clean(wrong)
        assert said in str(caught.value), (wrong, caught.value)


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


def test_a_channel_on_a_node_not_ready_says_how_to_start_its_worker_and_what_it_will_run():
    from datetime import timedelta as delta

    from channels_app.models import Node

    staff, member = factories.user("boss", staff=True), factories.user("ana")
    qwen = factories.llm("qwen")
    chat = factories.preset(qwen, "chat", "-c 4096")
    channel = factories.channel("a100-0", default=chat)
    Node.objects.filter(pk=channel.node_id).update(last_heartbeat=timezone.now() - delta(hours=1))
    client = Client()
    client.force_login(staff)
    card = _card(client.get("/").content.decode(), "a100-0")
    assert "node not ready" in card
    assert f"SLOTSERVE_NODE_NAME={channel.node.name} .venv/bin/python manage.py nodeworker" in card
    assert "qwen / chat" in card  # its default, not "—"
    client.force_login(member)
    card = _card(client.get("/").content.decode(), "a100-0")
    assert "node not ready" in card and "manage.py" not in card and "qwen / chat" in card


def test_a_loading_card_gives_no_estimate_it_does_not_have():
    from channels_app.models import ChannelRuntime, LoadRecord
    from slotserve_base.vocabulary import Phase

    staff = factories.user("boss", staff=True)
    tiny = factories.llm("tiny")
    channel = factories.channel("a100-0")
    now = timezone.now()
    for n in range(3):  # a tiny model: each load took 0.3 s
        began = now - timedelta(hours=n + 1)
        LoadRecord.objects.create(
            channel=channel,
            node=channel.node,
            model=tiny,
            started=began,
            finished=began + timedelta(seconds=0.3),
            succeeded=True,
        )
    ChannelRuntime.objects.create(channel=channel, phase=Phase.LOADING, model=tiny, since=now)
    client = Client()
    client.force_login(staff)
    card = _card(client.get("/").content.decode(), "a100-0")
    assert "0 s" not in card and "loading: under a second so far, usually under a second" in card


def _card(page: str, name: str) -> str:
    begun = page.index(f'data-channel="{name}"')
    return page[begun : page.index("</section>", begun)]


@needs_chromium
def test_any_channel_that_fits_tells_members_why_in_words_and_staff_the_scores(browser, live_server):  # noqa: F811
    factories.user("ana")
    factories.user("boss", staff=True)
    qwen = factories.llm("qwen")
    factories.channel("a100-0", on=factories.node("gpu-1", backends=["llama.cpp"]))
    day = (timezone.localtime() + timedelta(days=1)).date()

    def suggestion(username: str) -> str:
        page = sign_in(browser, live_server, username)
        page.goto(f"{live_server.url}/book/")
        page.select_option("#id_model", str(qwen.pk))
        page.fill("#id_start", f"{day:%Y-%m-%d}T09:00")
        page.fill("#id_end", f"{day:%Y-%m-%d}T10:00")
        page.wait_for_selector("#hints li[data-code=suggestion]")
        return str(page.inner_text("#hints li[data-code=suggestion]"))

    said = suggestion("ana")
    assert said.startswith("Will book: a100-0") and "score" not in said and "placement" not in said, said
    assert "room for qwen" in said, said
    assert "score" in suggestion("boss")


def test_the_booking_form_offers_only_the_channels_one_may_book():
    from django.contrib.auth.models import Group

    nlp, vision = Group.objects.create(name="nlp"), Group.objects.create(name="vision")
    ana = factories.user("ana")
    ana.groups.add(vision)
    closed, open_, shared = (
        factories.channel("a100-0"),
        factories.channel("a100-1"),
        factories.channel("a100-2"),
    )
    closed.allowed_groups.add(nlp)
    shared.allowed_groups.add(nlp, vision)
    client = Client()
    client.force_login(ana)
    page = client.get("/book/").content.decode()
    offered = page[page.index('name="channel"') : page.index("</select>", page.index('name="channel"'))]
    assert f'value="{open_.pk}"' in offered and f'value="{shared.pk}"' in offered
    assert f'value="{closed.pk}"' not in offered
    start = timezone.localtime() + timedelta(days=1)
    sent = client.post(
        "/book/",
        {
            "channel": closed.pk,
            "start": f"{start:%Y-%m-%d}T09:00",
            "end": f"{start:%Y-%m-%d}T10:00",
            "exclusive": "on",
        },
    )
    assert "for the groups nlp" in sent.content.decode()
    staff = factories.user("boss", staff=True)
    client.force_login(staff)
    page = client.get("/book/").content.decode()
    assert f'value="{closed.pk}"' in page  # staff book every channel


@needs_chromium
def test_a_series_with_one_clash_gives_one_verdict_not_an_all_clear_beside_it(browser, live_server):  # noqa: F811
    from tests.test_portal_week_one import weekly_series_with_its_second_date_taken

    page, _, _ = weekly_series_with_its_second_date_taken(browser, live_server, 4)
    page.wait_for_selector("#hints li[data-code=series]")
    hints = page.locator("#hints li").all_inner_texts()
    assert not any("No conflicts" in hint for hint in hints), hints
    assert any("1 of 4 dates cannot be booked" in hint for hint in hints), hints
    # Sent as it is, the page says why, and still gives no all-clear.
    page.click("#booking button[type=submit]")
    page.wait_for_selector("#hints li[data-code=series]")
    assert "1 of 4 occurrences cannot be booked" in page.content()
    assert not any("No conflicts" in hint for hint in page.locator("#hints li").all_inner_texts())
    # Skipping the clash is a booking that can be made: the one verdict is then the all-clear.
    page.check("#id_skip_conflicts")
    page.wait_for_selector("#hints li.ok")
    assert not page.locator("#hints li[data-code=series]").count()


def test_every_api_moment_is_written_in_utc_whoever_asks_and_wherever_it_is_made():
    """One format (docs/api.md): a webhook body made in a Berlin user's request and one made by a
    task, and the REST API read in a Berlin session, all write ``…Z``."""
    import zoneinfo

    from rest_framework.test import APIClient

    from slotserve_base.iso import iso_moment

    moment = timezone.now().replace(microsecond=0)
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    with timezone.override(berlin):
        assert iso_moment(moment) == moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
    ana = factories.user("ana")
    profile = profile_for(ana)
    profile.time_zone, profile.time_zone_chosen = "Europe/Berlin", True
    profile.save()
    booking = factories.reservation(
        owner=ana, on=factories.channel("a100-0"), start=moment, end=moment + timedelta(hours=1)
    )
    client = APIClient()
    client.force_login(ana)
    (row,) = client.get("/api/reservations/").json()
    assert row["start"] == iso_moment(booking.start) and row["start"].endswith("Z"), row
    assert row["created"].endswith("Z"), row


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
    from datetime import datetime, time

    odd = datetime.combine(last, time(14, 30), tzinfo=berlin)
    assert expiry_words(odd, berlin) == f"works until {last:%a} {last.day} {last:%b}{_year(last)} 14:30 CET"


def _year(day: Any) -> str:
    return f" {day.year}" if day.year != timezone.now().year else ""


def test_approvals_date_the_neighbours_and_reject_the_ticked_with_one_reason():
    from datetime import datetime, time

    boss = factories.user("boss", staff=True)
    ana, bo = factories.user("ana"), factories.user("bo")
    channel = factories.channel("a100-0", policy="all")
    day = (timezone.localtime() + timedelta(days=2)).date()
    start = datetime.combine(day, time(10), tzinfo=timezone.get_current_timezone())
    # bo's booking is on the day before: it is no clash, and the page must not read like one.
    before = start - timedelta(hours=20)
    factories.reservation(owner=bo, on=channel, start=before, end=before + timedelta(hours=1))
    asks = [
        factories.reservation(
            owner=ana,
            on=channel,
            start=start + timedelta(hours=2 * n),
            end=start + timedelta(hours=2 * n + 1),
            status=ReservationStatus.PENDING,
        )
        for n in range(3)
    ]
    client = Client()
    client.force_login(boss)
    page = client.get("/approvals/").content.decode()
    row = page.split(f'id="reservation-{asks[0].pk}"')[1].split("</tr>")[0]
    local = timezone.localtime(before)
    assert f"bo {local:%a} {local.day} {local:%b} {local:%H:%M}–" in row, row
    assert 'id="tick-all"' in page and "Reject the ticked" in page
    # Without a reason nothing is rejected, and the page says what is missing.
    refused = client.post("/approvals/reject", {"reservation": [asks[0].pk, asks[2].pk]}, follow=True)
    assert "Say why" in refused.content.decode()
    assert {r.status for r in Reservation.objects.filter(pk__in=[a.pk for a in asks])} == {"pending"}
    done = client.post(
        "/approvals/reject",
        {"reservation": [asks[0].pk, asks[2].pk], "reason": "the GPU is in repair"},
        follow=True,
    )
    assert "2 rejected." in done.content.decode()
    found = {r.pk: r for r in Reservation.objects.filter(pk__in=[a.pk for a in asks])}
    assert [found[a.pk].status for a in asks] == ["rejected", "pending", "rejected"]
    assert found[asks[0].pk].reject_reason == "the GPU is in repair"
    stranger = Client()
    stranger.force_login(bo)
    assert (
        stranger.post("/approvals/reject", {"reservation": [asks[1].pk], "reason": "no"}).status_code == 403
    )


@needs_chromium
def test_approvals_tick_all_at_once(browser, live_server):  # noqa: F811
    factories.user("boss", staff=True)
    ana = factories.user("ana")
    channel = factories.channel("a100-0", policy="all")
    start = timezone.now() + timedelta(days=1)
    for n in range(3):
        at = start + timedelta(hours=2 * n)
        factories.reservation(
            owner=ana, on=channel, start=at, end=at + timedelta(hours=1), status=ReservationStatus.PENDING
        )
    page = sign_in(browser, live_server, "boss")
    page.goto(f"{live_server.url}/approvals/")
    page.check("#tick-all")
    assert page.locator("input[name=reservation]:checked").count() == 3
    page.uncheck("#tick-all")
    assert page.locator("input[name=reservation]:checked").count() == 0


@needs_chromium
def test_on_a_phone_the_keys_requests_usage_and_models_tables_are_cards(browser, live_server):  # noqa: F811
    from gateway.api_keys import api_key_create
    from gateway.models import RequestLog

    boss = factories.user("boss", staff=True)
    api_key_create(user=boss, name="a-notebook-key-with-a-long-name")
    channel = factories.channel("a100-with-a-long-channel-name-0")
    factories.llm("qwen2.5-coder-32b-instruct-q4_k_m")
    now = timezone.now()
    factories.reservation(
        owner=boss, on=channel, start=now - timedelta(hours=2), end=now - timedelta(hours=1)
    )
    RequestLog.objects.create(
        at=now - timedelta(minutes=5),
        user=boss,
        channel=channel,
        model="qwen2.5-coder-32b-instruct-q4_k_m",
        path="/channels/a100-with-a-long-channel-name-0/v1/chat/completions",
        status=403,
        duration_ms=3.0,
        error_code="gpu_reserved",
        error="channel a100-with-a-long-channel-name-0 is reserved by someone else until Sat 5 Dec 14:00 UTC",
    )
    page = sign_in(browser, live_server, "boss", width=390, height=844)
    for path in ("/keys/", "/requests/", "/usage/?by=channel&period=week", "/models/"):
        page.goto(f"{live_server.url}{path}")
        sideways = page.evaluate(
            "[...document.querySelectorAll('main table')].map(t => t.scrollWidth - t.clientWidth)"
        )
        assert sideways and max(sideways) <= 1, (path, sideways)
        assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0, path
        shot(page, "phone-" + path.strip("/").split("/")[0].split("?")[0])
    page.goto(f"{live_server.url}/keys/")
    box = page.locator("#keys-table button", has_text="Revoke").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, box


@needs_chromium
def test_a_calendar_block_shows_who_and_what_and_in_full_on_focus(browser, live_server):  # noqa: F811
    from datetime import datetime, time

    ana, bo = factories.user("ana"), factories.user("bo")
    qwen = factories.llm("qwen2.5-7b")
    chat = factories.preset(qwen, "chat")
    channel = factories.channel("a100-0")
    day = (timezone.localtime() + timedelta(days=1)).date()
    at = datetime.combine(day, time(10), tzinfo=timezone.get_current_timezone())
    factories.reservation(owner=ana, on=channel, start=at, end=at + timedelta(hours=2), target=chat)
    factories.reservation(
        owner=bo, on=channel, start=at + timedelta(hours=3), end=at + timedelta(hours=5), target=chat
    )
    page = sign_in(browser, live_server, "ana", width=1366, height=768)
    page.goto(f"{live_server.url}/calendar/?day={day:%Y-%m-%d}")
    mine, theirs = page.locator("button.res.mine"), page.locator("button.res:not(.mine)")

    def shown(block: Any) -> list[str]:
        """Each line of the block, marked if it is cut off."""
        return list(
            block.evaluate(
                "b => [...b.children].map(s => s.textContent"
                " + (s.scrollWidth > s.clientWidth + 1 ? ' (cut)' : ''))"
            )
        )

    assert shown(mine) == ["yours", "qwen2.5-7b"], shown(mine)
    assert shown(theirs) == ["bo", "qwen2.5-7b"], shown(theirs)
    theirs.focus()
    said = page.inner_text("#lane-cursor")
    assert "bo" in said and "qwen2.5-7b / chat" in said and "13:00–15:00" in said, said
    assert "qwen2.5-7b / chat" in (theirs.get_attribute("title") or "")
    shot(page, "calendar-blocks-who-and-what")


@needs_chromium
def test_typing_a_start_keeps_the_length_and_a_changed_length_is_said_before_saving(browser, live_server):  # noqa: F811
    """Real key presses in Chromium's own date-time fields (en-US: a leading 0 in the hour empties
    the field for a moment): the end follows the start through it."""
    from datetime import datetime, time

    ana = factories.user("ana")
    channel = factories.channel("a100-0")
    day = (timezone.localtime() + timedelta(days=1)).date()
    start = datetime.combine(day, time(10), tzinfo=timezone.get_current_timezone())
    booking = factories.reservation(owner=ana, on=channel, start=start, end=start + timedelta(hours=2))
    page = sign_in(browser, live_server, "ana")
    page.goto(f"{live_server.url}/reservations/{booking.pk}/change")
    page.focus("#id_start")  # its month
    for _ in range(3):
        page.keyboard.press("ArrowRight")  # day, year, hour
    page.keyboard.type("02")
    assert page.input_value("#id_start") == f"{day:%Y-%m-%d}T02:00"
    assert page.input_value("#id_end") == f"{day:%Y-%m-%d}T04:00"
    assert "2 h" in page.inner_text("#length-said") and "was" not in page.inner_text("#length-said")
    # A change of the end that changes the length is said before it is saved.
    page.focus("#id_end")
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    page.keyboard.type("07")
    said = page.inner_text("#length-said")
    assert "5 h" in said and "was 2 h" in said, said
    page.click("#change button[type=submit]")
    page.wait_for_selector("text=Reservation changed.")
    booking.refresh_from_db()
    assert (timezone.localtime(booking.start).hour, timezone.localtime(booking.end).hour) == (2, 7)
    # On the book page, typing the start's day moves the end's day too.
    later = day + timedelta(days=1 if day.day < 27 else -1)
    page.goto(
        f"{live_server.url}/book/?channel={channel.pk}&start={day:%Y-%m-%d}T14:00Z&end={day:%Y-%m-%d}T15:30Z"
    )
    page.focus("#id_start")
    page.keyboard.press("ArrowRight")  # its day
    page.keyboard.type(f"{later.day:02d}")
    assert page.input_value("#id_start") == f"{later:%Y-%m-%d}T14:00"
    assert page.input_value("#id_end") == f"{later:%Y-%m-%d}T15:30"


@needs_chromium
def test_the_badges_count_a_new_request_without_a_reload(browser, settings):  # noqa: F811
    """Served as ``./slotserve start`` serves it (ASGI, WebSockets): a request that awaits
    approval shows in the approver's open page's badges."""

    from slotserve_site.asgi import application
    from tests.conftest import serving

    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
    factories.user("boss", staff=True)
    ana = factories.user("ana")
    channel = factories.channel("a100-0", policy="all")
    with serving(application) as url:
        page = live_page(browser, url, "boss", "/calendar/")
        assert not page.locator("#approvals-count").count()
        book_from_another_thread(ana, channel)
        page.wait_for_selector("#approvals-count:has-text('1')", timeout=10_000)
        page.wait_for_selector("#unread-count:has-text('1')", timeout=10_000)
        assert page.url == f"{url}/calendar/"  # no reload


@needs_chromium
def test_a_webhooks_log_shows_each_try_as_it_is_made_without_a_reload(browser, settings):  # noqa: F811
    """Served as ``./slotserve start`` serves it: a delivery tried while the owner's Webhooks page
    is open shows in its log, with the receiver's answer, and the page is not reloaded."""

    from reservations.webhooks.services import webhook_create
    from slotserve_site.asgi import application
    from tests.conftest import serving
    from tests.receiver import Receiver

    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
    settings.SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    ana = factories.user("ana")
    channel = factories.channel("a100-0", policy="all")
    with Receiver(statuses=[202]) as receiver, serving(application) as url:
        webhook = webhook_create(owner=ana, url=receiver.url, events=["booking.requested"])
        page = live_page(browser, url, "ana", "/webhooks/")
        page.evaluate("() => { window.stillThisPage = true; }")
        log = page.locator(f"#webhook-{webhook.pk} table.deliveries")
        assert "Nothing sent yet" in log.inner_text()
        book_from_another_thread(ana, channel)
        page.wait_for_selector(f"#webhook-{webhook.pk} table.deliveries div.try", timeout=10_000)
        assert "booking.requested" in log.inner_text() and "202" in log.inner_text()
        assert page.evaluate("() => window.stillThisPage === true")  # no reload


def live_page(chromium: Any, url: str, username: str, path: str) -> Any:
    """``username``'s page at ``path`` on the ASGI server at ``url``, once its live connection is open."""
    from types import SimpleNamespace

    from tests.test_browser import signed_in

    page = signed_in(chromium.new_page(), SimpleNamespace(url=url), username)
    page.goto(f"{url}{path}")
    page.wait_for_function("() => window.slotserveLive && window.slotserveLive.open", timeout=10_000)
    return page


def book_from_another_thread(user: Any, channel: Any) -> None:
    """A pending whole-card booking made from another thread, as a web request or a task makes it
    (Playwright's own event loop runs in the test's)."""
    import threading

    from reservations.services import reservation_create

    start = timezone.now() + timedelta(days=1)
    kwargs = {"user": user, "channel": channel, "start": start, "end": start + timedelta(hours=1)}
    booking = threading.Thread(
        target=reservation_create, kwargs={**kwargs, "exclusive": True, "now": timezone.now()}
    )
    booking.start()
    booking.join()
