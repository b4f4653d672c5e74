"""A channel's story (docs/scheduling.md, "A channel's story"): what the stages keep, the words it
is told in, why a booking's model was or was not ready, who may read it, and a real load failure,
fallback and recovery told in order."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from channels_app.models import StoryEntry
from channels_app.scheduling.services import channel_reload, decide_channels, override_clear, override_set
from gateway.models import RequestLog
from portal.story.telling import Booking, Entry, Names, _said, about, lines, seconds, verdict
from slotserve_base.happenings import Happening, tell
from slotserve_base.vocabulary import Phase
from tests import factories
from tests.factories import iso
from tests.test_browser import browser  # noqa: F401  (a fixture)
from tests.test_node_worker import converge, out_of_memory, phase_after

T0 = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
NAMES = Names(models={1: "qwen", 2: "small"}, presets={10: "long", 20: "default"})
ANA = Booking(
    id=5, user="ana", start=T0, end=T0 + timedelta(hours=1), model_id=1, preset_id=10, exclusive=False
)
QWEN = {"model_id": 1, "preset_id": 10, "fallback": False}


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_a_quick_load_is_under_a_second_not_about_under_a_second():
    assert (about(0.4), about(40)) == ("under a second", "about 40 s")
    quick = [
        Entry(at(-30), "decided", {**QWEN, "reason": "preload_next", "booking_id": 5, "load_seconds": 0.4})
    ]
    said = verdict(ANA, quick, NAMES, previous=None, estimate=None, now=at(-20), tz=UTC)
    assert "loads in under a second" in said and "about under" not in said


def test_spans_in_words():
    assert [seconds(s) for s in (0.4, 40, 119.6, 185, 3600, 7200, 7500)] == [
        "under a second",
        "40 s",
        "2 min",
        "3 min 5 s",
        "60 min",
        "2 h",
        "2 h 5 min",
    ]


def test_a_model_preloaded_in_time_is_said_ready_before_the_start():
    story = [
        Entry(
            at(-130), "decided", {"model_id": 1, "preset_id": 10, "reason": "preload_next", "booking_id": 5}
        ),
        Entry(at(-129), "loading", QWEN),
        Entry(at(-74), "ready", {**QWEN, "load_seconds": 55.2}),
    ]
    said = verdict(ANA, story, NAMES, previous=None, estimate=50, now=at(600), tz=UTC)
    assert said == (
        "qwen (long) was ready when ana's slot began: ready at 09:58:46, 74 s before the start "
        "(loaded in 55 s)."
    )


def test_a_short_gap_says_how_long_the_gap_was_and_how_long_the_model_loads():
    bo = Booking(id=4, user="bo", start=at(-3600), end=at(-40), model_id=2, preset_id=20, exclusive=False)
    story = [
        Entry(at(-40), "decided", {**QWEN, "reason": "preload_next", "booking_id": 5, "load_seconds": 55.0}),
        Entry(at(-40), "stopping", {"model_id": 2, "preset_id": 20}),
        Entry(at(-38), "loading", QWEN),
        Entry(at(17), "ready", {**QWEN, "load_seconds": 55.0}),
    ]
    said = verdict(ANA, story, NAMES, previous=bo, estimate=None, now=at(600), tz=UTC)
    assert said == (
        "qwen (long) was not ready when ana's slot began at 10:00:00. The gap before the slot was 40 s "
        "(bo's booking ended at 09:59:20); this model loads in about 55 s on this node. "
        "It was ready at 10:00:17, 17 s into the slot; this load took 55 s."
    )


def test_a_late_model_says_what_held_the_channel_and_how_long_its_load_really_took():
    """Planned with a 15 s estimate a minute ahead; the default kept draining its requests for
    50 s, then the load took 3 min 20 s: the verdict says both, not the estimate alone."""
    small = {"model_id": 2, "preset_id": 20, "fallback": False}
    story = [
        Entry(at(-60), "decided", {**QWEN, "reason": "preload_next", "booking_id": 5, "load_seconds": 15.0}),
        Entry(at(-60), "draining", small),
        Entry(at(-12), "stopping", small),
        Entry(at(-10), "stopped", {}),
        Entry(at(-10), "loading", QWEN),
        Entry(at(190), "ready", {**QWEN, "load_seconds": 200.0}),
    ]
    said = verdict(ANA, story, NAMES, previous=None, estimate=None, now=at(600), tz=UTC)
    assert said == (
        "qwen (long) was not ready when ana's slot began at 10:00:00. Preloading was chosen at 09:59:00, "
        "60 s ahead; this model loads in about 15 s on this node. Its load began at 09:59:50, 50 s "
        "later: small (default) held the channel until it stopped at 09:59:50. "
        "It was ready at 10:03:10, 3 min 10 s into the slot; this load took 3 min 20 s, not the 15 s "
        "expected."
    )


def test_a_failure_names_its_error_and_the_fallback_that_served():
    story = [
        Entry(at(-300), "decided", {**QWEN, "reason": "preload_next", "booking_id": 5, "load_seconds": 30.0}),
        Entry(at(-299), "loading", QWEN),
        Entry(at(-280), "failed", {**QWEN, "error": "It ran out of memory", "attempts": 1, "retry_at": "x"}),
        Entry(at(-279), "loading", {"model_id": 2, "preset_id": 20, "fallback": True}),
        Entry(at(-270), "ready", {"model_id": 2, "preset_id": 20, "fallback": True}),
    ]
    said = verdict(ANA, story, NAMES, previous=None, estimate=None, now=at(60), tz=UTC)
    assert said == (
        "qwen (long) was not ready when ana's slot began at 10:00:00. Preloading was chosen at 09:55:00, "
        "5 min ahead; this model loads in about 30 s on this node. It failed at 09:55:20: It ran out of "
        "memory. The default model small (default) served the booking from 09:55:30. It is not ready yet."
    )
    # At the end of the slot, what never came is said so.
    assert verdict(ANA, story, NAMES, previous=None, estimate=None, now=at(4000), tz=UTC).endswith(
        "It was not ready during the slot."
    )


def test_a_silent_node_is_named_and_a_slot_to_come_or_a_whole_card_said_as_such():
    story = [
        Entry(at(-200), "node_not_ready", {"node": {"name": "gpu-2"}}),
        Entry(at(90), "node_ready", {"node": {"name": "gpu-2"}}),
    ]
    said = verdict(ANA, story, NAMES, previous=None, estimate=42, now=at(600), tz=UTC)
    assert "The node's worker was not reporting from 09:56:40 until 10:01:30." in said
    assert verdict(ANA, [], NAMES, previous=None, estimate=42, now=at(-60), tz=UTC) == (
        "ana's slot has not begun: qwen (long) will be preloaded in time "
        "(this model loads in about 42 s on this node)."
    )
    card = Booking(id=6, user="ana", start=T0, end=at(600), model_id=None, preset_id=None, exclusive=True)
    assert verdict(
        card, [Entry(at(-5), "stopped", {})], NAMES, previous=None, estimate=None, now=at(9), tz=UTC
    ) == ("ana's booking holds the whole card: no model ran when it began.")


def test_lines_put_bookings_and_happenings_on_one_axis():
    story = [
        Entry(at(0), "ready", {**QWEN, "booking_id": 5}),
        Entry(at(-10), "loading", QWEN),
        Entry(at(-7200), "stopped", {"model_id": 2}),  # before the window
    ]
    told = lines(story, [ANA], NAMES, start=at(-600), end=at(3600 + 60), now=at(4000), tz=UTC)
    assert [(line.kind, line.words) for line in told] == [
        ("loading", "Loading qwen (long)."),
        ("booking_started", "ana's slot began (its model)."),
        ("ready", "qwen (long) is ready."),
        ("booking_ended", "ana's slot ended."),
    ]
    # While the slot runs, its end is still to come: not told.
    assert [
        line.kind for line in lines(story, [ANA], NAMES, start=at(-600), end=at(3660), now=at(60), tz=UTC)
    ] == [
        "loading",
        "booking_started",
        "ready",
    ]


def test_a_retry_is_told_with_its_attempt_and_a_failure_with_its_next_try():
    from channels_app.node_worker.announce import channel_facts
    from channels_app.node_worker.lifecycle import Failure, ProcessState, Tell
    from slotserve_base.target import Target
    from slotserve_base.vocabulary import WebhookEvent

    qwen = Target(1, 10)
    failure = Failure(qwen, attempts=2, retry_at=at(60), error="It ran out of memory.")
    failed = ProcessState(phase=Phase.FAILED, running=qwen, failure=failure, error="It ran out of memory.")
    loading = ProcessState(phase=Phase.LOADING, running=qwen, failure=failure)
    assert channel_facts(failed, loading, []) == [("channel.loading", {**QWEN, "attempt": 3})]
    told = [Tell(WebhookEvent.CHANNEL_FAILED, episode=at(-60))]
    assert channel_facts(loading, failed, told) == [
        (
            "channel.failed",
            {
                **QWEN,
                "error": "It ran out of memory.",
                "attempts": 2,
                "retry_at": "2026-12-07T10:01:00Z",
                "episode": "2026-12-07T09:59:00Z",
            },
        )
    ]
    assert _said(
        Entry(
            at(0),
            "failed",
            {**QWEN, "error": "It ran out of memory.", "attempts": 2, "retry_at": "2026-12-07T10:01:00Z"},
        ),
        NAMES,
        UTC,
    ) == ("qwen (long) failed: It ran out of memory (attempt 2, next try at 10:01:00).")
    assert channel_facts(loading, loading, []) == []


@pytest.mark.django_db
def test_decisions_are_kept_when_they_change_and_overrides_and_reloads_say_who(tiny, staff):
    channel = factories.channel(default=tiny.small)
    now = timezone.now()
    decide_channels(now=now)
    decide_channels(now=now + timedelta(seconds=5))  # nothing changed: nothing kept
    override_set(
        channel=channel, model=tiny.model, preset=tiny.big, until=now + timedelta(hours=1), now=now, by=staff
    )
    decide_channels(now=now + timedelta(seconds=6))
    override_clear(channel=channel, now=now + timedelta(seconds=7), by=staff)
    channel_reload(channel=channel, now=now + timedelta(seconds=8), by=staff)
    kept = list(StoryEntry.objects.filter(channel=channel).values_list("kind", "data"))
    assert [kind for kind, _ in kept] == ["decided", "override_set", "decided", "override_cleared", "reload"]
    assert kept[0][1]["reason"] == "default" and kept[2][1]["reason"] == "manual_override"
    assert kept[1][1]["by"] == "admin" and kept[4][1]["by"] == "admin"


@pytest.mark.django_db
def test_a_silent_node_is_one_spell_however_often_it_is_told(tiny):
    channel = factories.channel(default=tiny.small)
    node = channel.node

    def told(kind: str, seconds_in: int) -> None:
        tell(
            Happening(
                type=kind,
                at=T0 + timedelta(seconds=seconds_in),
                data={"node": {"id": node.pk, "name": node.name}, "last_heartbeat": "2026-12-07T09:59:00Z"},
                subject=f"node:{node.pk}",
                words="",
                channels=frozenset({channel.pk}),
            )
        )

    told("node.ready", 0)  # a node that was never silent: nothing to tell
    told("node.not_ready", 10)
    told("node.not_ready", 20)
    told("node.ready", 30)
    assert list(StoryEntry.objects.values_list("kind", flat=True)) == ["node_not_ready", "node_ready"]


@pytest.mark.django_db
def test_members_read_the_story_of_channels_they_may_use_without_whose_requests(tiny, ana, bo, staff):
    from django.contrib.auth.models import Group

    channel = factories.channel(default=tiny.small)
    kept_for = factories.channel(default=tiny.small)
    kept_for.allowed_groups.add(Group.objects.create(name="vision"))
    now = timezone.now()
    for who, status, queued in ((ana, 200, None), (bo, 200, 350.0), (bo, 403, None)):
        RequestLog.objects.create(
            at=now - timedelta(minutes=3),
            user=who,
            channel=channel,
            path="/v1/chat/completions",
            status=status,
            duration_ms=1200,
            queued_ms=queued,
        )
    member, admin = APIClient(), APIClient()
    member.force_authenticate(ana)
    admin.force_authenticate(staff)
    mine = member.get(f"/api/channels/{channel.pk}/story")
    assert mine.status_code == 200
    [bucket] = [b for b in mine.data["requests"]["buckets"] if b["requests"]]
    assert (bucket["requests"], bucket["served"], bucket["refused"], bucket["waited"]) == (3, 2, 1, 1)
    assert bucket["wait_ms_max"] == 350.0 and bucket["places_in_use"] == round(2400 / 60000, 2)
    assert "by_user" not in mine.data["requests"]
    assert admin.get(f"/api/channels/{channel.pk}/story").data["requests"]["by_user"] == {"bo": 2, "ana": 1}
    assert member.get(f"/api/channels/{kept_for.pk}/story").status_code == 404
    assert admin.get(f"/api/channels/{kept_for.pk}/story").status_code == 200


@pytest.mark.django_db
def test_the_requests_chart_is_a_time_axis_with_its_quiet_minutes(tiny, ana):
    """Every minute of the window is a bucket, empty ones too: a quiet stretch reads as quiet,
    not as the next busy minute beside the last."""
    channel = factories.channel(default=tiny.small)
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=10)
    for minute in (1, 4):
        RequestLog.objects.create(
            at=start + timedelta(minutes=minute, seconds=5),
            user=ana,
            channel=channel,
            path="/v1/chat/completions",
            status=200,
            duration_ms=100,
        )
    api = APIClient()
    api.force_authenticate(ana)
    window = {"from": (start).isoformat(), "to": (start + timedelta(minutes=6)).isoformat()}
    buckets = api.get(f"/api/channels/{channel.pk}/story", window).data["requests"]["buckets"]
    assert [b["at"] for b in buckets] == [iso(start + timedelta(minutes=m)) for m in range(6)]
    assert [b["requests"] for b in buckets] == [0, 1, 0, 0, 1, 0]


@pytest.mark.django_db
def test_bad_windows_and_bookings_are_named(tiny, ana):
    channel, other = factories.channel(default=tiny.small), factories.channel(default=tiny.small)
    now = timezone.now()
    elsewhere = factories.reservation(
        owner=ana, on=other, start=now, end=now + timedelta(hours=1), target=tiny.big
    )
    api = APIClient()
    api.force_authenticate(ana)
    url = f"/api/channels/{channel.pk}/story"
    for query, field, words in (
        ("?from=yesterday", "from", "not an ISO 8601 time"),
        ("?from=2026-12-07T10:00Z&to=2026-12-07T09:00Z", "to", "to must be after from"),
        ("?from=2026-12-01T10:00Z&to=2026-12-09T10:00Z", "to", "at most 7 days"),
        ("?booking=abc", "booking", "is not a booking id"),
        (f"?booking={elsewhere.pk}", "booking", f"no booking {elsewhere.pk} on the channel {channel.name}"),
    ):
        answer = api.get(url + query)
        assert answer.status_code == 400, query
        assert words in str(answer.json()[field]), (query, answer.json())
    person = Client()
    person.force_login(ana)
    page = person.get(f"/channel/{channel.pk}/story?from=yesterday")
    assert page.status_code == 400 and b"not an ISO 8601 time" in page.content


@pytest.mark.django_db(transaction=True)
def test_a_real_load_failure_fallback_and_recovery_read_in_order(node_env, tiny, ana):
    """The node worker's out-of-memory stand-in fails the booked model; the default serves; the
    fixed preset loads at its retry. The story and the booking's verdict say so, in order."""
    greedy = out_of_memory(tiny)
    channel = factories.channel("cpu-0", default=tiny.small)
    now = timezone.now()
    booking = factories.reservation(
        owner=ana, on=channel, start=now + timedelta(seconds=1), end=now + timedelta(hours=1), target=greedy
    )
    decide_channels(now=now)
    failed = converge(channel, until={Phase.FAILED})
    assert converge(channel, until={Phase.READY}).fallback
    greedy.args = "--max-model-len 8192"
    greedy.save()
    assert failed.retry_at is not None
    assert phase_after(channel, failed.retry_at) == Phase.STOPPING
    converge(channel, until={Phase.READY}, now=failed.retry_at + timedelta(seconds=1))

    while timezone.now() <= booking.start:  # the slot has begun when the story is read
        time.sleep(0.05)
    api = APIClient()
    api.force_authenticate(ana)
    answer = api.get(
        f"/api/channels/{channel.pk}/story?booking={booking.pk}&to={factories.iso(now + timedelta(hours=2))}"
    )
    assert answer.status_code == 200, answer.content
    told = [(line["kind"], line["words"]) for line in answer.data["lines"]]
    kinds = [kind for kind, _ in told]
    expected = [
        "decided", "loading", "failed", "fallback", "loading", "ready",
        "stopping", "loading", "ready", "recovered", "switched",
    ]  # fmt: skip
    assert [k for k in kinds if k != "booking_started"] == expected, told
    planned_with = StoryEntry.objects.get(channel=channel, kind="decided").data["load_seconds"]
    assert planned_with > 0  # the estimate the scheduler planned the preload with, kept
    assert told[0][1] == (
        f"The scheduler chose big-vllm (greedy): preloading for ana's {_hm(booking.start)} booking; "
        f"it loads in about {seconds(planned_with)} here (from the file's size at SLOTSERVE_DISK_READ_MBPS)."
    )
    assert told[1][1] == "Loading big-vllm (greedy)."
    assert told[2][1].startswith("big-vllm (greedy) failed: ") and "ran out of memory" in told[2][1]
    assert "(attempt 1, next try at " in told[2][1]
    assert ("loading", "Loading tiny (small) as the fallback.") in told
    assert (
        "fallback",
        "The default model tiny (small) serves ana's booking while the booked model waits for its retry.",
    ) in told
    assert told[-2] == ("recovered", "big-vllm (greedy) serves again after its failure.")
    assert told[-1] == ("switched", "Switched from tiny to big-vllm.")
    said = answer.data["booking"]["verdict"]
    assert said.startswith(
        f"big-vllm (greedy) was not ready when ana's slot began at {_hm(booking.start, s=True)}."
    )
    assert "It failed at " in said and "ran out of memory" in said
    assert "The default model tiny (small) served the booking from " in said
    assert said.endswith("into the slot.")

    person = Client()
    person.force_login(ana)
    page = person.get(f"/channel/{channel.pk}/story?booking={booking.pk}")
    assert page.status_code == 200
    assert "served the booking from" in page.content.decode() and 'id="verdict"' in page.content.decode()


def _hm(moment: datetime, *, s: bool = False) -> str:
    return timezone.localtime(moment).strftime("%H:%M:%S" if s else "%H:%M")


@pytest.mark.django_db
def test_story_rows_older_than_the_retention_go(settings, tiny):
    from slotserve_site.tasks import forget_old

    settings.SLOTSERVE_STORY_DAYS = 30
    channel = factories.channel(default=tiny.small)
    now = timezone.now()
    decide_channels(now=now - timedelta(days=31))
    channel_reload(channel=channel, now=now - timedelta(days=29), by=None)
    assert forget_old(now) >= 1
    assert list(StoryEntry.objects.values_list("kind", flat=True)) == ["reload"]


@pytest.mark.django_db(transaction=True)
def test_the_story_reads_on_a_desk_and_on_a_phone(browser, live_server, tiny, ana):  # noqa: F811
    """What happened to ana's booking, from her reservations page, with the verdict first."""
    from pathlib import Path

    from channels_app import story
    from channels_app.models import StoryKind
    from tests.test_browser import CHROMIUM, shot, sign_in

    if not Path(CHROMIUM).exists():
        pytest.skip("needs Chromium (apt-get install chromium)")
    channel = factories.channel("a100-0", default=tiny.small)
    now = timezone.now().replace(microsecond=0)
    start = now - timedelta(minutes=20)
    booking = factories.reservation(
        owner=ana, on=channel, start=start, end=now + timedelta(hours=1), target=tiny.big
    )
    booked = {
        "model_id": tiny.model.pk,
        "preset_id": tiny.big.pk,
        "fallback": False,
        "booking_id": booking.pk,
    }
    small = {"model_id": tiny.model.pk, "preset_id": tiny.small.pk}
    for seconds_in, kind, data in (
        (-90, StoryKind.DECIDED, {**booked, "reason": "preload_next", "load_seconds": 55.0}),
        (-88, StoryKind.STOPPING, small),
        (-86, StoryKind.LOADING, booked),
        (-70, StoryKind.FAILED, {**booked, "error": "The GPU ran out of memory while loading the model."}),
        (-69, StoryKind.LOADING, {**small, "fallback": True}),
        (-60, StoryKind.READY, {**small, "fallback": True, "load_seconds": 9.0}),
        (-60, StoryKind.FALLBACK, small),
        (40, StoryKind.LOADING, {**booked, "attempt": 2}),
        (95, StoryKind.READY, {**booked, "load_seconds": 55.0}),
        (95, StoryKind.RECOVERED, booked),
    ):
        story.told(channel.pk, start + timedelta(seconds=seconds_in), kind, **data)
    for minute in range(0, 18):
        for n in range(minute % 5 + 1):
            RequestLog.objects.create(
                at=start + timedelta(minutes=minute, seconds=n), user=ana, channel=channel,
                path="/v1/chat/completions", status=200, duration_ms=900, queued_ms=200.0 if n > 3 else None,
            )  # fmt: skip
    page = sign_in(browser, live_server, "ana", width=1366, height=900)
    page.goto(f"{live_server.url}/reservations/")
    page.get_by_role("link", name="What happened to my booking").click()
    verdict_box = page.locator("#verdict")
    assert "was not ready when ana's slot began" in verdict_box.inner_text()
    assert "It failed at" in verdict_box.inner_text() and "into the slot" in verdict_box.inner_text()
    assert page.locator("figure.chart svg").count() == 1
    assert page.locator("#story li").first.inner_text().endswith("it loads in about 55 s here.")
    shot(page, "story")
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
    shot(page, "phone-story")


@pytest.mark.django_db
def test_a_member_reads_only_the_bookings_they_could_see_elsewhere_and_a_cancelled_one_says_so(tiny, ana, bo):
    from reservations.models import ReservationStatus

    channel = factories.channel(default=tiny.small)
    now = timezone.now()
    made = {}
    for hours, status in enumerate(("cancelled", "rejected", "pending", "approved"), start=1):
        made[status] = factories.reservation(
            owner=bo,
            on=channel,
            start=now + timedelta(hours=hours),
            end=now + timedelta(hours=hours, minutes=30),
            target=tiny.big,
            status=getattr(ReservationStatus, status.upper()),
        )
    api = APIClient()
    api.force_authenticate(ana)
    url = f"/api/channels/{channel.pk}/story"
    for status in ("cancelled", "rejected"):  # not on the calendar: not hers to read
        answer = api.get(url, {"booking": made[status].pk})
        assert answer.status_code == 400, (status, answer.data)
    for status in ("pending", "approved"):  # on the calendar for everyone
        assert api.get(url, {"booking": made[status].pk}).status_code == 200
    api.force_authenticate(bo)  # his own, whatever became of them
    said = {s: api.get(url, {"booking": made[s].pk}).data["booking"]["verdict"] for s in made}
    assert "was cancelled" in said["cancelled"] and "preloaded" not in said["cancelled"], said
    assert "was rejected" in said["rejected"] and "preloaded" not in said["rejected"], said
    assert "waiting for approval" in said["pending"] and "preloaded in time" not in said["pending"], said
    assert "will be preloaded in time" in said["approved"]


@pytest.mark.django_db
def test_a_decision_is_kept_once_when_two_deciders_race_at_a_bookings_start(tiny, ana, monkeypatch):
    """The tick and the re-decision at a booking's start decide the same change microseconds
    apart: the story keeps it once."""
    from channels_app.scheduling import selectors

    channel = factories.channel(default=tiny.small)
    now = timezone.now()
    decide_channels(now=now)
    factories.reservation(owner=ana, on=channel, start=now, end=now + timedelta(hours=1), target=tiny.big)
    stale = selectors.decision_inputs(now=now + timedelta(seconds=1), channel_ids=None)  # read before…
    decide_channels(now=now + timedelta(seconds=1))  # …the other decider stored the change
    monkeypatch.setattr(selectors, "decision_inputs", lambda **_: stale)
    decide_channels(now=now + timedelta(seconds=1, microseconds=40))
    kept = [d["reason"] for d in StoryEntry.objects.filter(channel=channel).values_list("data", flat=True)]
    assert kept == ["default", "active_reservation"], kept
