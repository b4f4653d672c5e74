"""The edges of a slot on the whole stack: the scheduler decides, the node worker starts a real
``llama-server`` with the tiny model, the gateway answers in front (docs/scheduling.md, the
access table). Every caller gets an answer they can act on while a channel loads or switches."""

from __future__ import annotations

import threading
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from channels_app.scheduling.services import decide_channels
from gateway.api_keys import api_key_create
from slotserve_base.vocabulary import Phase
from tests import factories
from tests.clock import eventually
from tests.test_node_worker import converge


def ask(url: str, key: str, **headers: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"Authorization": f"Bearer {key}", **headers},
        timeout=90,
    )


def code(answer: httpx.Response) -> tuple[int, str]:
    return answer.status_code, answer.json()["error"]["code"]


@pytest.mark.django_db(transaction=True)
def test_a_request_sent_as_a_channel_is_created_is_held_and_answered(gateway_url, node_env, tiny, ana):
    _, key = api_key_create(user=ana, name="t")
    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    # Nothing runs yet, but the decision names the model: it is loading, not missing.
    refused = ask(gateway_url, key)
    assert code(refused) == (503, "model_loading"), refused.text
    assert int(refused.headers["Retry-After"]) >= 1
    answers: list[httpx.Response] = []
    waiting = threading.Thread(
        target=lambda: answers.append(ask(gateway_url, key, **{"X-SlotServe-Wait": "60"})), daemon=True
    )
    waiting.start()
    converge(channel, until={Phase.READY})
    waiting.join(timeout=70)
    assert answers and answers[0].status_code == 200, answers[0].text if answers else "no answer"
    assert answers[0].json()["choices"][0]["message"]["content"] is not None


@pytest.mark.django_db(transaction=True)
def test_at_a_back_to_back_boundary_the_booker_is_served_only_their_own_preset(
    gateway_url, node_env, tiny, ana, bo
):
    from gateway.models import RequestLog
    from gateway.usage.request_log import flush_request_log
    from slotserve_base.redis_client import redis_client

    _, ana_key = api_key_create(user=ana, name="t")
    _, bo_key = api_key_create(user=bo, name="t")
    channel = factories.channel("cpu-0", default=tiny.small)
    decide_channels(now=timezone.now())
    small = converge(channel, until={Phase.READY})
    assert ask(gateway_url, bo_key).status_code == 200  # the default, open to all
    # Ana booked the other preset; her slot begins before the node worker has switched.
    start = timezone.now() + timedelta(seconds=1.5)
    factories.reservation(owner=ana, on=channel, start=start, end=start + timedelta(hours=1), target=tiny.big)
    decide_channels(now=timezone.now())
    assert eventually(lambda: timezone.now() >= start + timedelta(seconds=0.1), timeout=5, every=0.02)
    switching = ask(gateway_url, ana_key)
    assert code(switching) == (503, "model_switching"), switching.text  # not the last preset's answer
    assert code(ask(gateway_url, bo_key))[0] == 403  # her slot, whatever runs
    big = converge(channel, until={Phase.READY})
    assert (big.preset_id, big.pid != small.pid) == (tiny.big.pk, True)
    served = ask(gateway_url, ana_key, **{"X-SlotServe-Wait": "10"})  # the gateway may look once more
    assert served.status_code == 200, served.text
    flush_request_log(redis_client())
    logged = RequestLog.objects.filter(user=ana).values_list("status", "served_model")
    assert sorted(logged) == [(200, "tiny"), (503, "")]  # the refusal was served by nothing


def test_a_snapshot_holds_the_slot_that_begins_within_its_life(db, settings, ana):
    """The gateway's snapshot carries the next booking of a channel when it begins before the
    snapshot could be read again: the gateway keeps its booker's channel from its first moment,
    without waiting for a new snapshot."""
    from gateway.admit.snapshot import read_snapshot
    from gateway.rules.access import as_of

    settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS = 1.0
    channel = factories.channel("ch")
    now = timezone.now()
    soon = factories.reservation(
        owner=ana, on=channel, start=now + timedelta(seconds=1.5), end=now + timedelta(hours=1)
    )
    later = factories.channel("later")
    factories.reservation(owner=ana, on=later, start=now + timedelta(minutes=5), end=now + timedelta(hours=1))
    views = {view.name: view for view in read_snapshot().channels}
    assert views["ch"].booking is None and views["ch"].upcoming is not None
    assert views["ch"].upcoming.reservation_id == soon.pk
    assert as_of(views["ch"], soon.start).booking == views["ch"].upcoming
    assert views["later"].upcoming is None, "one far ahead waits for a later snapshot"


def test_a_slow_snapshot_read_is_as_old_as_its_first_query(db, monkeypatch):
    """A snapshot's age counts from when its data was read, not from when the read ended: a read
    that a database restart held up for seconds must not pass as new (a lab's week under
    faults saw someone answered 7.75 s into another person's slot after such a read)."""
    import time

    from channels_app.scheduling import selectors
    from gateway.admit.snapshot import read_snapshot

    estimates = selectors.load_estimates

    def held_up(wanted):
        time.sleep(0.5)  # the database answers slowly, mid-read
        return estimates(wanted)

    monkeypatch.setattr(selectors, "load_estimates", held_up)
    before = time.monotonic()
    snapshot = read_snapshot()
    assert snapshot.taken_at <= before + 0.2, "its age counts from its first query"
