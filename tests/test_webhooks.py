"""Webhooks (docs/webhooks.md): every event reaches a real HTTP receiver once, signed and verified
with the Standard Webhooks library; retries with growing pauses, in order per object, never again
after a 2xx; a failing webhook paused and its owner told; addresses inside the machine refused;
a user's webhook hears only of their own; the portal, the API and the admin."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from celery.signals import task_postrun
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from standardwebhooks.webhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError

from channels_app.node_worker.announce import channel_facts
from channels_app.node_worker.lifecycle import ProcessState, Tell
from gateway.api_keys import api_key_create, tell_keys_expiring
from gateway.usage.budgets import tell_budgets_used
from gateway.wire.counter_scripts import week_tokens_key
from reservations.idle import apply_idle_rule
from reservations.models import Notification
from reservations.reminders import send_starting_soon
from reservations.services import (
    NewBooking,
    reservation_approve,
    reservation_cancel,
    reservation_change,
    reservation_create,
    reservation_end,
    reservation_reject,
    waitlist_join,
)
from reservations.webhooks import delivery as deliveries
from reservations.webhooks.edges import announce_booking_edges, announce_node_changes
from reservations.webhooks.models import Delivery, DeliveryState, Webhook
from reservations.webhooks.services import webhook_create, webhook_resume, webhook_test
from reservations.webhooks.tasks import webhooks_due
from slotserve_base.dispatch import WEBHOOK_DELIVER, webhook_queue
from slotserve_base.redis_client import redis_client
from slotserve_base.target import Target
from slotserve_base.vocabulary import NotificationEvent, Phase, WebhookEvent
from tests import factories
from tests.clock import eventually
from tests.queued import worker
from tests.receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _receivers_on_loopback(settings):
    """The tests' receivers listen on this machine: staff allow loopback, as a lab allows its own
    chat server's network."""
    settings.SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]


@pytest.fixture(autouse=True)
def _webhooks_worker():
    """The webhooks' own worker, as in a deployment: deliveries go as they are queued, a retry
    after its pause."""
    with worker(webhook_queue()):
        yield


def verified(webhook: Webhook, receiver: Receiver) -> list[dict[str, Any]]:
    """Every delivery the receiver got, verified with the Standard Webhooks library."""
    verifier = Verifier(webhook.secret)
    return [verifier.verify(r.body, r.headers) for r in receiver.received]


def hour(offset: float) -> datetime:
    return (timezone.now() + timedelta(hours=offset)).replace(second=0, microsecond=0)


def test_every_event_arrives_once_signed_and_verified_by_the_standard_webhooks_library(staff, ana, bo):
    open_channel = factories.channel("a100-0", default=factories.preset(factories.llm("qwen")))
    approved_channel = factories.channel("a100-1", policy="all")
    approved_channel.idle_warn_minutes, approved_channel.idle_release_minutes = 5, 10
    approved_channel.save()
    target = open_channel.default_preset
    with Receiver() as receiver:
        webhook = webhook_create(owner=staff, url=receiver.url, scope="all", name="lab chat")
        now = timezone.now()
        # booking.requested and .approved (at once), .changed, .cancelled
        first = reservation_create(
            NewBooking(user=ana, channel=open_channel, start=hour(2), end=hour(3), model=target.model),
            now=now,
        )
        reservation_change(reservation=first, by=ana, now=now, end=hour(4))
        reservation_cancel(reservation=first, by=ana, now=now)
        # booking.requested (pending), then .rejected; another approved by staff
        asked = reservation_create(
            NewBooking(user=bo, channel=approved_channel, start=hour(2), end=hour(3), exclusive=True), now=now
        )
        reservation_reject(reservation=asked, by=staff, reason="the card is in repair", now=now)
        kept = reservation_create(
            NewBooking(user=bo, channel=approved_channel, start=hour(5), end=hour(6), exclusive=True), now=now
        )
        reservation_approve(reservation=kept, by=staff, now=now)
        # waitlist.slot_freed: ana waits for bo's slot, bo cancels
        waitlist_join(user=ana, channel=approved_channel, start=hour(5), end=hour(6), now=now)
        reservation_cancel(reservation=kept, by=bo, now=now)
        # booking.starting_soon, .started, .ended, .ended_early, .released_idle
        soon = reservation_create(
            NewBooking(user=ana, channel=open_channel, start=hour(5), end=hour(7), model=target.model),
            now=now,
        )
        send_starting_soon(now=soon.start - timedelta(minutes=10))
        announce_booking_edges(now=soon.start + timedelta(minutes=1))
        announce_booking_edges(now=soon.end + timedelta(minutes=1))
        early = reservation_create(
            NewBooking(user=ana, channel=open_channel, start=hour(8), end=hour(9), model=target.model),
            now=now,
        )
        reservation_end(reservation=early, by=staff, now=early.start + timedelta(minutes=20))
        factories.reservation(
            owner=bo,
            on=approved_channel,
            start=now - timedelta(minutes=11),
            end=now + timedelta(hours=1),
            target=target,
        )
        apply_idle_rule(now=now)  # warned: no event
        apply_idle_rule(now=now + timedelta(minutes=10))  # released
        # node.not_ready, node.ready
        beat = open_channel.node.last_heartbeat
        assert beat is not None
        announce_node_changes(now=beat + timedelta(minutes=5))
        announce_node_changes(now=beat)
        # limit.reached
        from django.conf import settings

        settings.SLOTSERVE_LIMIT_WEEKLY_TOKENS = 1000
        redis_client().set(week_tokens_key(bo.pk), 1200)
        tell_budgets_used(redis_client(), now=timezone.now())
        tell_budgets_used(redis_client(), now=timezone.now())  # once a week
        # key.expiring
        api_key_create(user=ana, name="ci", expires_at=now + timedelta(days=3))
        tell_keys_expiring(now=now + timedelta(days=2))  # half its life left
        # webhook.test
        webhook_test(webhook=webhook, by=staff, now=now)
        expected = set(WebhookEvent.values) - {e for e in WebhookEvent.values if e.startswith("channel.")}
        assert eventually(lambda: set(receiver.types()) >= expected, timeout=15), expected - set(
            receiver.types()
        )
        events = verified(webhook, receiver)
    by_type: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_type.setdefault(event["type"], []).append(event)
    many = (
        "booking.requested",
        "booking.approved",
        "booking.cancelled",
        "booking.started",
        "node.ready",
        "node.not_ready",
    )
    once = {t for t in expected if t not in many}
    assert {t: len(by_type[t]) for t in once} == dict.fromkeys(once, 1)
    assert len(by_type["booking.requested"]) == 5  # each booking once
    # Each booking that began, once: the one that ran its course (the periodic job told it), and
    # the one ended early and the one released idle before the job ran (their ends told it).
    started = [e["data"]["booking"]["id"] for e in by_type["booking.started"]]
    assert len(started) == len(set(started)) == 3 and {soon.pk, early.pk} <= set(started)
    # The payload: the type, the time in UTC, the objects' ids and names, the portal link.
    rejected = by_type["booking.rejected"][0]
    assert rejected["timestamp"].endswith("Z")
    booking = rejected["data"]["booking"]
    assert booking["id"] == asked.pk and booking["user"] == {"id": bo.pk, "username": "bo"}
    assert booking["channel"] == {"id": approved_channel.pk, "name": "a100-1"}
    assert (
        rejected["data"]["reason"] == "the card is in repair" and rejected["data"]["link"] == "/reservations/"
    )
    assert by_type["limit.reached"][0]["data"]["used"] == 1200
    nodes = {open_channel.node.name, approved_channel.node.name}
    for kind in ("node.not_ready", "node.ready"):  # each node lost and back, once
        assert sorted(e["data"]["node"]["name"] for e in by_type[kind]) == sorted(nodes)
    assert by_type["key.expiring"][0]["data"]["key"]["name"] == "ci"
    assert by_type["booking.released_idle"][0]["data"]["unused_minutes"] == 21
    # One event per happening: a changed booking's events are all about it, in order.
    first_types = [e["type"] for e in events if e["data"].get("booking", {}).get("id") == first.pk]
    assert first_types == ["booking.requested", "booking.approved", "booking.changed", "booking.cancelled"]
    # Each delivery's webhook-id is its own, and the signature fails with another secret.
    assert len({r.msg_id for r in receiver.received}) == len(receiver.received)
    with pytest.raises(WebhookVerificationError):
        Verifier("whsec_" + "A" * 32).verify(receiver.received[0].body, receiver.received[0].headers)


def test_a_channels_events_come_from_the_node_worker_with_a_real_process(node_env, tiny, ana, staff):
    """Loading, ready, failed, in fallback, stopping, recovered and switched, from the node worker's own
    reconciles of a real llama-server and the stand-in backend's out-of-memory failure."""
    from channels_app.scheduling.services import decide_channels
    from tests.test_node_worker import converge, out_of_memory, phase_after

    greedy = out_of_memory(tiny)
    channel = factories.channel("cpu-0", default=tiny.small)
    with Receiver() as receiver, Receiver() as staffs:
        channel_events_only = [e for e in WebhookEvent.values if e.startswith("channel.")]
        webhook_create(owner=ana, url=receiver.url, events=channel_events_only)
        webhook_create(owner=staff, url=staffs.url, scope="all", channels=[channel])
        webhook_create(owner=staff, url=staffs.url, scope="all", channels=[factories.channel("elsewhere")])
        now = timezone.now()
        booking = factories.reservation(
            owner=ana,
            on=channel,
            start=now - timedelta(minutes=1),
            end=now + timedelta(hours=1),
            target=greedy,
        )
        decide_channels(now=now)
        failed = converge(channel, until={Phase.FAILED})
        converge(channel, until={Phase.READY})  # the default, as the fallback
        greedy.args = "--max-model-len 8192"
        greedy.save()
        retry = failed.retry_at
        assert retry is not None
        assert phase_after(channel, retry) == Phase.STOPPING
        converge(channel, until={Phase.READY}, now=retry + timedelta(seconds=1))
        wanted = [
            "channel.loading",
            "channel.failed",
            "channel.fallback",
            "channel.loading",
            "channel.ready",
            "channel.stopping",
            "channel.loading",
            "channel.ready",
            "channel.recovered",
            "channel.switched",
        ]
        # The booker's own webhook hears of it, and staff's for this channel (not the other's).
        assert eventually(lambda: len(receiver.received) >= len(wanted), timeout=15), receiver.types()
        assert eventually(lambda: len(staffs.received) >= len(wanted), timeout=15), staffs.types()
        # Nothing more: every webhook's deliverer has run once more and found nothing to send.
        assert [deliveries.deliver(pk) for pk in Webhook.objects.values_list("pk", flat=True)] == [0, 0, 0]
        assert len(receiver.received) + len(staffs.received) == 2 * len(wanted)
    assert receiver.types() == wanted and staffs.types() == wanted
    mine = [r.json for r in receiver.received]
    failed_event = next(e for e in mine if e["type"] == "channel.failed")
    assert "ran out of memory" in failed_event["data"]["error"]
    assert failed_event["data"]["booking"] == {"id": booking.pk, "user": {"id": ana.pk, "username": "ana"}}
    switched = next(e for e in mine if e["type"] == "channel.switched")
    assert switched["data"]["previous_model"]["name"] == tiny.model.name
    assert switched["data"]["model"]["name"] == "big-vllm"


def test_the_lifecycles_news_become_happenings_in_the_order_they_happened():
    def kinds(before: ProcessState, after: ProcessState, actions: list[Tell]) -> list[str]:
        return [event for event, _ in channel_facts(before, after, actions)]

    loading = ProcessState(phase=Phase.LOADING, running=Target(1))
    assert kinds(ProcessState(), loading, []) == ["channel.loading"]
    ready = ProcessState(phase=Phase.READY, running=Target(1))
    told = [Tell(WebhookEvent.CHANNEL_RECOVERED)]
    assert kinds(loading, ready, told) == ["channel.ready", "channel.recovered"]
    assert kinds(ready, ready, []) == []
    # A failure is told when it fails, before the stop it leads to; the failed phase it rests in
    # afterwards is not told again.
    stopping = ProcessState(phase=Phase.STOPPING, running=Target(1), failing=True)
    failure = [Tell(WebhookEvent.CHANNEL_FAILED, episode=timezone.now())]
    assert kinds(loading, stopping, failure) == ["channel.failed", "channel.stopping"]
    assert kinds(stopping, ProcessState(phase=Phase.FAILED), []) == []
    # The booked model's readiness is the ready itself, marked as the booked one.
    [(_, facts)] = channel_facts(loading, ready, [Tell(WebhookEvent.CHANNEL_READY)])
    assert facts["booked"] is True
    [(_, facts)] = channel_facts(loading, ready, [])
    assert facts["booked"] is False


def test_a_receiver_that_fails_twice_gets_the_event_three_times_with_growing_pauses(settings, ana):
    settings.SLOTSERVE_WEBHOOK_RETRY_SECONDS = [0.4, 1.2, 5.0]
    channel = factories.channel("a100-0", default=factories.preset(factories.llm("qwen")))
    with Receiver([500, 500, 200]) as receiver:
        webhook = webhook_create(owner=ana, url=receiver.url, events=["booking.requested"])
        reservation_create(
            NewBooking(user=ana, channel=channel, start=hour(2), end=hour(3), model=channel.default_model),
            now=timezone.now(),
        )

        def due() -> bool:
            webhooks_due()
            return Delivery.objects.filter(webhook=webhook, state=DeliveryState.DELIVERED).exists()

        assert eventually(due, timeout=10, every=0.05)
        # Delivered: never again, however often the periodic job looks or the deliverer runs.
        assert [webhooks_due() for _ in range(3)] == [0, 0, 0] and deliveries.deliver(webhook.pk) == 0
        assert len(receiver.received) == 3
    first, second, third = receiver.received
    assert first.msg_id == second.msg_id == third.msg_id  # one event, three tries
    pauses = (second.at - first.at, third.at - second.at)
    assert 0.4 <= pauses[0] < pauses[1] and pauses[1] >= 1.2
    assert len({r.headers["webhook-timestamp"] for r in receiver.received}) >= 2  # each try signed anew
    verified(webhook, receiver)
    sent = Delivery.objects.get(webhook=webhook)
    assert sent.state == DeliveryState.DELIVERED and sent.tries == 3
    log = list(sent.attempts.values_list("status_code", "answer"))
    assert log == [(500, "answered 500"), (500, "answered 500"), (200, "answered 200")]


def test_one_bookings_events_keep_their_order_while_the_receiver_fails(settings, ana):
    # The first retry waits long enough that the next two bookings' events go out before it on
    # a loaded machine.
    settings.SLOTSERVE_WEBHOOK_RETRY_SECONDS = [2.0, 0.3, 0.3]
    channel = factories.channel("a100-0", policy="all")
    other = factories.channel("a100-1")
    with Receiver([503, 200]) as receiver:
        webhook = webhook_create(owner=ana, url=receiver.url)
        now = timezone.now()
        asked = reservation_create(
            NewBooking(user=ana, channel=channel, start=hour(2), end=hour(3), exclusive=True), now=now
        )
        # The first try of "requested" failed: "cancelled" of the same booking waits behind it,
        # while another booking's events go on.
        reservation_cancel(reservation=asked, by=ana, now=now)
        factories.user("staffer", staff=True)
        reservation_create(
            NewBooking(user=ana, channel=other, start=hour(2), end=hour(3), exclusive=True), now=now
        )
        assert eventually(lambda: len(receiver.received) >= 3)
        assert [r.json["type"] for r in receiver.received][:3] == [
            "booking.requested",  # 503
            "booking.requested",  # the other booking's
            "booking.approved",
        ]

        def due() -> bool:
            webhooks_due()
            return len(receiver.received) >= 5

        assert eventually(due, timeout=10, every=0.05)
    first_booking = [r.json["type"] for r in receiver.received if r.json["data"]["booking"]["id"] == asked.pk]
    assert first_booking == ["booking.requested", "booking.requested", "booking.cancelled"]
    # The receiver counts a request before its sender has written down the answer.
    delivered = Delivery.objects.filter(webhook=webhook, state=DeliveryState.DELIVERED)
    assert eventually(lambda: delivered.count() == 4), list(Delivery.objects.values_list("pk", "state"))


def test_a_webhook_that_keeps_failing_is_paused_its_owner_told_and_resumed_in_order(settings, ana):
    settings.SLOTSERVE_WEBHOOK_RETRY_SECONDS = [0.1, 0.1]
    channel = factories.channel("a100-0")
    with Receiver([500]) as receiver:
        webhook = webhook_create(owner=ana, url=receiver.url, events=["booking.requested"])
        now = timezone.now()
        reservation_create(
            NewBooking(user=ana, channel=channel, start=hour(2), end=hour(3), exclusive=True), now=now
        )

        def paused() -> bool:
            webhooks_due()
            return Webhook.objects.filter(pk=webhook.pk, paused_at__isnull=False).exists()

        assert eventually(paused, timeout=5, every=0.05)
        webhook.refresh_from_db()
        assert webhook.paused_at is not None and "3 tries" in webhook.paused_reason
        told = Notification.objects.get(user=ana, event=NotificationEvent.WEBHOOK_PAUSED)
        assert "paused" in told.text and told.link == "/webhooks/"
        # Paused: a later event waits, it is not sent, whatever looks or runs.
        reservation_create(
            NewBooking(user=ana, channel=channel, start=hour(4), end=hour(5), exclusive=True), now=now
        )
        assert [webhooks_due() for _ in range(3)] == [0, 0, 0] and deliveries.deliver(webhook.pk) == 0
        assert len(receiver.received) == 3
        receiver.statuses = [200]
        webhook_resume(webhook=webhook, now=timezone.now())
        assert eventually(lambda: len(receiver.received) == 4, timeout=5)
    # The last try is recorded as its task ends, a moment after the receiver has its answer.
    states = lambda: list(  # noqa: E731
        Delivery.objects.filter(webhook=webhook).order_by("pk").values_list("state", flat=True)
    )
    assert eventually(lambda: states() == [DeliveryState.FAILED, DeliveryState.DELIVERED]), states()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:6379/",  # this machine's Redis
        "http://localhost:8000/admin/",
        "http://169.254.169.254/latest/meta-data/",  # a cloud's metadata service
        "http://10.0.0.5/hook",
        "http://192.168.1.20/hook",
        "http://[::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://0.0.0.0:9000/",
        # IPv4 inside IPv6, every standard way: compatible, translated, NAT64 (well-known and
        # local-use), 6to4 and Teredo (whose client address is stored inverted).
        "http://[::127.0.0.1]/hook",
        "http://[::ffff:0:127.0.0.1]/hook",
        "http://[64:ff9b::127.0.0.1]/hook",
        "http://[64:ff9b::10.0.0.5]/hook",
        "http://[64:ff9b:1::7f00:1]/hook",
        "http://[2002:7f00:1::]/hook",
        "http://[2002:a9fe:a9fe::1]/hook",
        "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/hook",
    ],
)
def test_a_url_inside_the_machines_networks_is_refused(settings, ana_api, url):
    settings.SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS = []
    answer = ana_api.post("/api/webhooks/", {"url": url}, format="json")
    assert answer.status_code == 400, answer.content
    assert "url" in answer.json() and "SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS" in answer.json()["message"]
    assert not Webhook.objects.exists()


def test_a_url_that_turns_private_after_it_was_saved_is_not_called(settings, ana):
    with Receiver() as receiver:
        webhook = webhook_create(owner=ana, url=receiver.url)
        settings.SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS = []
        delivery = webhook_test(webhook=webhook, by=ana, now=timezone.now())
        # Its one try (a test is never retried) was made, and refused before connecting.
        assert eventually(lambda: Delivery.objects.get(pk=delivery.pk).state == DeliveryState.FAILED)
        assert not receiver.received
    assert "refused: 127.0.0.1 is 127.0.0.1, inside" in delivery.attempts.get().error


def test_bad_urls_and_events_are_named(ana_api, staff_api):
    for body, field in [
        ({"url": "ftp://example.org/x"}, "url"),
        ({"url": "not a url"}, "url"),
        ({"url": "https://user:pw@example.org/x"}, "url"),
        ({"url": "https://example.org/x", "events": ["booking.exploded"]}, "events"),
        ({"url": "https://example.org/x", "scope": "all"}, "scope"),
        ({"url": "https://example.org/x", "body": "xml"}, "body"),
    ]:
        answer = ana_api.post("/api/webhooks/", body, format="json")
        assert answer.status_code == 400 and answer.json()["message"].startswith(field), (
            body,
            answer.content,
        )
    assert not Webhook.objects.exists()


def test_a_users_webhook_hears_only_of_their_own_bookings(ana, bo):
    channel = factories.channel("a100-0")
    with Receiver() as receiver:
        webhook_create(owner=ana, url=receiver.url, scope="mine")
        now = timezone.now()
        reservation_create(
            NewBooking(user=bo, channel=channel, start=hour(2), end=hour(3), exclusive=True), now=now
        )
        mine = reservation_create(
            NewBooking(user=ana, channel=channel, start=hour(4), end=hour(5), exclusive=True), now=now
        )
        assert eventually(lambda: len(receiver.received) == 2)
        assert deliveries.deliver(Webhook.objects.get().pk) == 0  # nothing more to send
        assert len(receiver.received) == 2
    assert {r.json["data"]["booking"]["id"] for r in receiver.received} == {mine.pk}


def test_user_text_in_a_slack_compatible_body_is_escaped_as_slack_says(staff, ana, bo):
    """A key named ``<!here> <http://evil.example|Reset>`` and an approver's reason must reach
    staff's Slack as text, not as a live mention and link: ``&``, ``<`` and ``>`` escaped."""
    channel = factories.channel("a100-1", policy="all")
    hostile = "<!here> <http://evil.example|Reset> & more"
    with Receiver() as receiver:
        webhook_create(owner=staff, url=receiver.url, scope="all", body="slack")
        api_key_create(user=ana, name=hostile, expires_at=timezone.now() + timedelta(days=3))
        tell_keys_expiring(now=timezone.now() + timedelta(days=2))
        asked = reservation_create(
            NewBooking(user=bo, channel=channel, start=hour(2), end=hour(3), exclusive=True),
            now=timezone.now(),
        )
        reservation_reject(reservation=asked, by=staff, reason=hostile, now=timezone.now())
        assert eventually(lambda: {"key.expiring", "booking.rejected"} <= set(_slack_kinds(receiver)))
    texts = [r.json["text"] for r in receiver.received]
    hostile_ones = [t for t in texts if "evil.example" in t]
    assert len(hostile_ones) >= 2, texts
    for text in hostile_ones:
        assert "<!here>" not in text and "<http://evil.example|Reset>" not in text, text
        assert "&lt;!here&gt; &lt;http://evil.example|Reset&gt; &amp; more" in text, text


def _slack_kinds(receiver: Receiver) -> list[str]:
    kinds = []
    for r in receiver.received:
        text = r.json["text"]
        kinds += ["key.expiring"] if "API key" in text else []
        kinds += ["booking.rejected"] if "reject" in text else []
    return kinds


def test_a_slack_compatible_body_is_in_the_owners_words_and_zone(settings, ana):
    from reservations.profiles import profile_for

    settings.SLOTSERVE_PUBLIC_URL = "https://gpu.lab.example"
    profile = profile_for(ana)
    profile.time_zone = "Europe/Berlin"
    profile.save()
    channel = factories.channel("a100-0")
    with Receiver() as receiver:
        webhook_create(owner=ana, url=receiver.url, body="slack", events=["booking.approved"])
        start = timezone.now().replace(hour=9, minute=0, second=0, microsecond=0) + timedelta(days=2)
        reservation_create(
            NewBooking(
                user=ana, channel=channel, start=start, end=start + timedelta(hours=1), exclusive=True
            ),
            now=timezone.now(),
        )
        assert eventually(lambda: len(receiver.received) == 1)
    text = receiver.received[0].json["text"]
    assert set(receiver.received[0].json) == {"text"}
    assert text.startswith("ana's booking of a100-0, ") and "approved at once" in text
    assert "CET" in text and "https://gpu.lab.example/reservations/" in text


def test_the_api_makes_tests_lists_and_redelivers_and_hides_other_peoples_webhooks(ana_api, bo_api, ana):
    with Receiver() as receiver:
        made = ana_api.post(
            "/api/webhooks/",
            {"url": receiver.url, "events": ["booking.approved", "webhook.test"], "name": "ci"},
            format="json",
        )
        assert made.status_code == 201, made.content
        hook = made.json()
        assert hook["secret"].startswith("whsec_") and hook["events"] == ["booking.approved", "webhook.test"]
        tested = ana_api.post(f"/api/webhooks/{hook['id']}/test")
        assert tested.status_code == 202
        assert eventually(lambda: len(receiver.received) == 1)
        assert eventually(
            lambda: (
                ana_api.get(f"/api/webhooks/{hook['id']}/deliveries/").json()["results"][0]["state"]
                == "delivered"
            )
        )
        log = ana_api.get(f"/api/webhooks/{hook['id']}/deliveries/").json()["results"]
        assert log[0]["type"] == "webhook.test" and log[0]["attempts"][0]["status_code"] == 200
        assert log[0]["attempts"][0]["answer"] == "answered 200"
        again = ana_api.post(f"/api/webhooks/{hook['id']}/deliveries/{log[0]['id']}/redeliver")
        assert again.status_code == 202
        assert eventually(lambda: len(receiver.received) == 2)
        assert receiver.received[0].msg_id == receiver.received[1].msg_id  # the same event again
        # Someone else's webhook is not there for bo, by any path.
        assert bo_api.get(f"/api/webhooks/{hook['id']}/").status_code == 404
        assert bo_api.get(f"/api/webhooks/{hook['id']}/deliveries/").status_code == 404
        assert bo_api.post(f"/api/webhooks/{hook['id']}/test").status_code == 404
        assert (
            bo_api.post(f"/api/webhooks/{hook['id']}/deliveries/{log[0]['id']}/redeliver").status_code == 404
        )
        assert bo_api.delete(f"/api/webhooks/{hook['id']}/").status_code == 404
        assert bo_api.get("/api/webhooks/").json() == []
        changed = ana_api.patch(
            f"/api/webhooks/{hook['id']}/", {"events": ["booking.started"]}, format="json"
        )
        assert changed.status_code == 200 and changed.json()["events"] == ["booking.started"]
        paused = ana_api.post(f"/api/webhooks/{hook['id']}/pause")
        assert paused.status_code == 200 and paused.json()["paused_at"] is not None
        assert ana_api.post(f"/api/webhooks/{hook['id']}/resume").json()["paused_at"] is None
        assert ana_api.delete(f"/api/webhooks/{hook['id']}/").status_code == 204
    assert not Webhook.objects.exists()


def test_the_portal_page_makes_a_webhook_sends_a_test_and_shows_the_log(ana, bo):
    portal = Client()
    portal.force_login(ana)
    with Receiver([500, 200]) as receiver:
        made = portal.post(
            "/webhooks/",
            {"url": receiver.url, "name": "lab chat", "events": ["booking.approved"], "body": "standard"},
        )
        assert made.status_code == 302
        webhook = Webhook.objects.get(owner=ana)
        page = portal.get("/webhooks/").content.decode()
        assert "lab chat" in page and webhook.secret in page and "booking.approved" in page
        portal.post(f"/webhooks/{webhook.pk}/test")
        assert eventually(lambda: len(receiver.received) == 1)
        # The try is recorded as its task ends, a moment after the receiver has its answer.
        assert eventually(lambda: "answered 500" in portal.get("/webhooks/").content.decode())
        assert "Redeliver" in portal.get("/webhooks/").content.decode()
        failed = Delivery.objects.get(webhook=webhook)
        portal.post(f"/webhooks/{webhook.pk}/deliveries/{failed.pk}/redeliver")
        assert eventually(lambda: len(receiver.received) == 2)
        assert eventually(lambda: "answered 200" in portal.get("/webhooks/").content.decode())
        # Bad input is named, not saved.
        refused = portal.post("/webhooks/", {"url": "http://10.1.2.3/x", "body": "standard"})
        assert refused.status_code == 400 and "private network" in refused.content.decode()
        # Its card's form changes it; a bad URL there is named and changes nothing.
        prefix = f"w{webhook.pk}"
        changed = portal.post(
            f"/webhooks/{webhook.pk}/change",
            {f"{prefix}-url": receiver.url, f"{prefix}-name": "lab chat", f"{prefix}-body": "slack"},
        )
        assert changed.status_code == 302
        webhook.refresh_from_db()
        assert (webhook.body, webhook.events) == ("slack", [])
        refused = portal.post(
            f"/webhooks/{webhook.pk}/change",
            {f"{prefix}-url": "http://169.254.169.254/", f"{prefix}-body": "slack"},
        )
        assert (
            refused.status_code == 400
            and "169.254.169.254 is 169.254.169.254, inside" in refused.content.decode()
        )
        webhook.refresh_from_db()
        assert webhook.url == receiver.url
    other = Client()
    other.force_login(bo)
    assert webhook.secret not in other.get("/webhooks/").content.decode()
    assert other.post(f"/webhooks/{webhook.pk}/test").status_code == 404
    assert other.post(f"/webhooks/{webhook.pk}/delete").status_code == 404
    assert (
        other.post(f"/webhooks/{webhook.pk}/change", {f"w{webhook.pk}-url": "https://x.invalid/"}).status_code
        == 404
    )
    assert Webhook.objects.filter(pk=webhook.pk).exists()


def test_staff_see_every_webhook_in_the_admin(staff, ana, bo):
    webhook_create(owner=ana, url="https://hooks.example.org/ana")
    webhook_create(owner=bo, url="https://hooks.example.org/bo")
    admin = Client()
    admin.force_login(User.objects.get(pk=staff.pk))
    User.objects.filter(pk=staff.pk).update(is_superuser=True)
    page = admin.get("/admin/webhooks/webhook/").content.decode()
    assert "hooks.example.org/ana" in page and "hooks.example.org/bo" in page


def test_the_documented_receiver_verifies_and_prints_a_delivery(tmp_path, ana):
    """docs/webhooks.md's receiver example, run as it is written."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import free_port

    text = Path(__file__).resolve().parent.parent.joinpath("docs", "webhooks.md").read_text()
    example = re.search(r"```python\n(.*?)```", text, re.S)
    assert example is not None
    script = tmp_path / "receiver.py"
    script.write_text(example.group(1))
    port = free_port()
    webhook = webhook_create(owner=ana, url=f"http://127.0.0.1:{port}/slotserve")
    import os

    env = {**os.environ, "SLOTSERVE_WEBHOOK_SECRET": webhook.secret, "PORT": str(port)}
    process = subprocess.Popen(
        [sys.executable, "-u", str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        import httpx

        assert eventually(lambda: _listening(httpx, port), timeout=10)
        delivery = webhook_test(webhook=webhook, by=ana, now=timezone.now())
        assert eventually(lambda: Delivery.objects.get(pk=delivery.pk).state != DeliveryState.PENDING)
        assert Delivery.objects.get(pk=delivery.pk).state == DeliveryState.DELIVERED
        forged = httpx.post(
            f"http://127.0.0.1:{port}/slotserve",
            content=b'{"type":"booking.approved"}',
            headers={"webhook-id": "msg_x", "webhook-timestamp": "1", "webhook-signature": "v1,AAAA"},
        )
        assert forged.status_code == 401
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=10)
    assert "webhook.test" in out and json.dumps({"id": ana.pk, "username": "ana"}) in out


def _listening(httpx, port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/", timeout=0.5)
    except httpx.HTTPError:
        return False
    return True


def test_retries_grow_over_about_a_day_then_stop(settings):
    pauses = settings.SLOTSERVE_WEBHOOK_RETRY_SECONDS
    now = timezone.now()
    moments = [deliveries.next_try(tries, now, pauses) for tries in range(1, len(pauses) + 2)]
    assert moments[-1] is None  # the try after the last pause is the last
    waits = [(m - now).total_seconds() for m in moments[:-1] if m is not None]
    assert waits == pauses and waits[:7] == sorted(waits[:7])
    assert 20 * 3600 < sum(pauses) < 26 * 3600


def test_an_event_no_webhook_hears_of_is_not_kept_unless_it_is_told_once_only(ana, bo):
    from reservations.webhooks.models import Event

    channel = factories.channel("a100-0")
    webhook_create(owner=bo, url="https://hooks.example.invalid/bo")  # bo's own: hears nothing of ana's
    booking = reservation_create(
        NewBooking(user=ana, channel=channel, start=hour(2), end=hour(3), exclusive=True), now=timezone.now()
    )
    assert not Event.objects.exists()
    assert announce_booking_edges(now=booking.start + timedelta(minutes=1)) == 1
    assert announce_booking_edges(now=booking.start + timedelta(minutes=2)) == 0  # kept: told once
    assert list(Event.objects.values_list("type", "key")) == [
        ("booking.started", f"booking.started:{booking.pk}")
    ]
    assert not Delivery.objects.exists()


def paused_with_five_bookings(ana, receiver: Receiver) -> Webhook:
    """A paused webhook of ana's with five ``booking.requested`` events waiting in its log."""
    from reservations.webhooks.services import webhook_pause

    channel = factories.channel("a100-0")
    webhook = webhook_create(owner=ana, url=receiver.url, events=["booking.requested"])
    webhook_pause(webhook=webhook, now=timezone.now())
    for h in range(5):
        reservation_create(
            NewBooking(user=ana, channel=channel, start=hour(2 + h), end=hour(3 + h), exclusive=True),
            now=timezone.now(),
        )
    return webhook


@pytest.fixture
def deliverer_runs() -> Iterator[list[int]]:
    """How many deliveries each run of a webhook's deliverer tried, as the worker ran it."""
    tried: list[int] = []

    def ran(task: Any = None, retval: Any = None, **_: Any) -> None:
        if task is not None and task.name == WEBHOOK_DELIVER:
            tried.append(retval)

    task_postrun.connect(ran, weak=False)
    yield tried
    task_postrun.disconnect(ran)


def test_a_burst_of_events_goes_on_in_new_runs_without_waiting_for_the_next_tick(
    monkeypatch, ana, deliverer_runs
):
    monkeypatch.setattr(deliveries, "PER_RUN", 2)
    with Receiver() as receiver:
        webhook = paused_with_five_bookings(ana, receiver)
        assert not receiver.received
        webhook_resume(webhook=webhook, now=timezone.now())  # one task; runs of 2 follow each other
        assert eventually(lambda: len(receiver.received) == 5, timeout=5)
    # A run is recorded as its task ends, a moment after its last delivery arrived.
    assert eventually(lambda: sum(n or 0 for n in deliverer_runs) == 5, timeout=5), deliverer_runs
    assert deliverer_runs[:3] == [2, 2, 1], deliverer_runs
    starts = [r.json["data"]["booking"]["start"] for r in receiver.received]
    assert starts == sorted(starts)  # in the order they were made


def test_a_slow_receiver_does_not_hold_a_worker_its_deliveries_go_on_in_later_runs(
    monkeypatch, ana, deliverer_runs
):
    monkeypatch.setattr(deliveries, "RUN_SECONDS", 0.5)
    with Receiver(delay=0.3) as receiver:
        webhook = paused_with_five_bookings(ana, receiver)
        webhook_resume(webhook=webhook, now=timezone.now())
        # The periodic job (every tick) starts the later runs.
        assert eventually(lambda: webhooks_due() >= 0 and len(receiver.received) == 5, timeout=10, every=0.05)
    # Each run stopped starting deliveries after half a second (two at 0.3 s each).
    tried = [n for n in deliverer_runs if n]
    assert sum(tried) == 5 and len(tried) >= 3 and max(tried) <= 2, deliverer_runs


def test_a_slot_ended_before_the_edge_job_saw_it_begin_is_told_started_then_ended(staff, ana):
    """The periodic job announces a slot's start within a tick; a slot ended early before it ran
    (the scheduler down or behind) is told started by the end itself, first, once."""
    from reservations.webhooks.models import Event

    channel = factories.channel("a100-0")
    webhook_create(owner=staff, url="https://hooks.example.invalid/lab", scope="all")
    now = timezone.now()
    booking = reservation_create(
        NewBooking(
            user=ana,
            channel=channel,
            start=now - timedelta(minutes=5),
            end=now + timedelta(hours=1),
            exclusive=True,
        ),
        now=now - timedelta(minutes=10),
    )
    reservation_end(reservation=booking, by=ana, now=now)  # no edge job ran since it began
    assert announce_booking_edges(now=now + timedelta(seconds=1)) == 0
    told = list(
        Event.objects.filter(subject=f"reservation:{booking.pk}").order_by("pk").values_list("type", "at")
    )
    assert [kind for kind, _ in told] == [
        "booking.requested",
        "booking.approved",
        "booking.started",
        "booking.ended_early",
    ]
    assert told[2][1] == booking.start


@pytest.mark.django_db
def test_a_used_budget_is_told_once_a_week_whatever_the_webhooks_keep(settings, bo):
    """``limit.reached`` is told once a week: the gateway keeps its own mark of having told it,
    so pruned events (or none kept at all) do not tell it again at the next flush."""
    from reservations.webhooks.models import Event

    settings.SLOTSERVE_LIMIT_WEEKLY_TOKENS = 1000
    client = redis_client()
    client.set(week_tokens_key(bo.pk), 1200)
    now = timezone.now()
    assert tell_budgets_used(client, now=now) == 1
    Event.objects.all().delete()  # as the webhooks' retention would
    assert tell_budgets_used(client, now=now + timedelta(minutes=1)) == 0
