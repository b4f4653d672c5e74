"""Warm handovers end to end (docs/scheduling.md, "Sleep and wake"): the stand-in plays vLLM
with its sleep mode (its endpoints, their guard, a wake that fails when the GPU's memory was
taken), driven by the node worker one reconcile at a time."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.test import Client
from django.utils import timezone

from channels_app.models import LoadRecord
from channels_app.node_worker import page_cache, processes, sleepers
from channels_app.scheduling.services import decide_channels
from reservations.models import Reservation
from slotserve_base.vocabulary import Phase
from tests import factories
from tests.test_node_worker import converge

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sleepy(node_env, settings, tiny):
    """A channel whose default is a vLLM model that can sleep, and a llama.cpp model to book."""
    settings.SLOTSERVE_SLEEP_MODE = True
    model = factories.llm("sleepy-vllm", backend="vllm")
    model.path = str(tiny.model.path)
    model.save()
    preset = factories.preset(model, "awake", "--standin-load-seconds 1.5")
    channel = factories.channel("cpu-0", default=preset)
    decide_channels(now=timezone.now())
    return channel, preset


def book_now(channel, owner, preset) -> Reservation:
    """A booking of ``preset`` that began a second ago, and the decision that follows it."""
    now = timezone.now()
    booking = factories.reservation(
        owner=owner, on=channel, start=now - timedelta(seconds=1), end=now + timedelta(hours=1), target=preset
    )
    decide_channels(now=now)
    return booking


def _url(runtime_or_record, path: str) -> str:
    host, port = (
        (runtime_or_record["host"], runtime_or_record["port"])
        if isinstance(runtime_or_record, dict)
        else (runtime_or_record.host, runtime_or_record.port)
    )
    return f"http://{host}:{port}{path}"


def test_the_default_sleeps_through_a_booking_and_wakes_without_a_cold_load(sleepy, tiny, ana):
    channel, preset = sleepy
    default = converge(channel, until={Phase.READY})
    first_run, first_pid = default.run_id, default.pid
    assert b"--enable-sleep-mode" in Path(f"/proc/{first_pid}/cmdline").read_bytes()
    booking = book_now(channel, ana, tiny.small)
    booked = converge(channel, until={Phase.READY})
    assert booked.model_id == tiny.model.pk
    asleep = booked.asleep
    assert asleep is not None and (asleep["run_id"], asleep["pid"]) == (first_run, first_pid)
    assert processes.alive(first_pid, first_run)[0]  # kept, not stopped
    secret = {"Authorization": f"Bearer {asleep['api_secret']}"}
    assert httpx.get(_url(asleep, "/is_sleeping"), headers=secret).json() == {"is_sleeping": True}
    # The sleeper's secret is shown nowhere: not in the admin, not in the API.
    client = Client()
    client.force_login(factories.user("root", staff=True, is_superuser=True))  # sees every row
    page = client.get(f"/admin/channels_app/channelruntime/{channel.pk}/change/")
    assert page.status_code == 200 and asleep["api_secret"] not in page.content.decode()
    shown = client.get(f"/api/channels/{channel.pk}/")
    assert shown.status_code == 200 and asleep["api_secret"] not in shown.content.decode()

    # The booking ends early: the default's turn. It wakes: the same process, no load.
    loads = LoadRecord.objects.filter(channel=channel).count()
    Reservation.objects.filter(pk=booking.pk).update(end=timezone.now())
    decide_channels(now=timezone.now())
    woken = converge(channel, until={Phase.READY}, timeout=20)
    assert (woken.run_id, woken.pid, woken.model_id) == (first_run, first_pid, preset.model_id)
    assert woken.asleep is None and not woken.waking
    assert LoadRecord.objects.filter(channel=channel).count() == loads  # a wake is not a load
    assert httpx.get(_url(woken, "/is_sleeping"), headers=secret).json() == {"is_sleeping": False}
    # The channel's story tells it as it was: put to sleep, woken, not loaded.
    api = Client()
    api.force_login(ana)
    words = [line["words"] for line in api.get(f"/api/channels/{channel.pk}/story").json()["lines"]]
    assert any(w.startswith("Putting sleepy-vllm") and "to sleep" in w for w in words), words
    assert any(w.startswith("Waking sleepy-vllm") for w in words), words
    assert any("sleepy-vllm" in w and "woken in" in w and "not loaded" in w for w in words), words


def test_sleep_endpoints_answer_nobody_without_the_runs_secret(sleepy):
    channel, _ = sleepy
    runtime = converge(channel, until={Phase.READY})
    for method, path in (("POST", "/sleep?level=1"), ("POST", "/wake_up"), ("GET", "/is_sleeping")):
        answer = httpx.request(method, _url(runtime, path))
        assert answer.status_code == 401, (path, answer.text)
        wrong = httpx.request(method, _url(runtime, path), headers={"Authorization": "Bearer guess"})
        assert wrong.status_code == 401, path
    assert httpx.get(_url(runtime, "/health")).status_code == 200  # kept open, as the backends keep it
    assert httpx.get(
        _url(runtime, "/is_sleeping"), headers={"Authorization": f"Bearer {runtime.api_secret}"}
    ).json() == {"is_sleeping": False}


def test_without_room_in_host_ram_the_default_is_stopped(sleepy, tiny, ana, monkeypatch):
    channel, _ = sleepy
    default = converge(channel, until={Phase.READY})
    monkeypatch.setattr(page_cache, "available_bytes", lambda: 1)
    book_now(channel, ana, tiny.small)
    booked = converge(channel, until={Phase.READY})
    assert booked.asleep is None
    assert not processes.alive(default.pid, default.run_id)[0]


def test_a_wake_that_fails_loads_the_default_cold(sleepy, tiny, ana):
    channel, preset = sleepy
    preset.args = "--standin-wake-oom"
    preset.save()
    default = converge(channel, until={Phase.READY})
    booking = book_now(channel, ana, tiny.small)
    asleep = converge(channel, until={Phase.READY}).asleep
    assert asleep is not None and asleep["run_id"] == default.run_id
    Reservation.objects.filter(pk=booking.pk).update(end=timezone.now())
    decide_channels(now=timezone.now())
    again = converge(channel, until={Phase.READY}, timeout=30)
    assert again.model_id == preset.model_id and again.run_id != default.run_id  # loaded anew
    assert not processes.alive(default.pid, default.run_id)[0]  # the sleeper that could not wake stopped
    assert again.error == ""
    assert "CUDA out of memory" in Path(default.log_path).read_text()


def test_a_sleeper_is_no_stray_and_stops_with_the_node(sleepy, tiny, ana, monkeypatch):
    from channels_app.node_worker import strays

    channel, _ = sleepy
    default = converge(channel, until={Phase.READY})
    book_now(channel, ana, tiny.small)
    booked = converge(channel, until={Phase.READY})
    assert booked.asleep is not None and booked.asleep["pid"] == default.pid
    # As a restarted worker sees it: no run is its own child; a run no channel names is a stray.
    monkeypatch.setattr(strays, "MIN_AGE_SECONDS", 0.0)
    monkeypatch.setattr(processes, "children", dict)
    assert strays.stop_strays(channel.node.name) == 0
    assert processes.alive(default.pid, default.run_id)[0]  # the channel's sleeper: kept
    monkeypatch.undo()
    assert sleepers.stop_local_processes(node_name=channel.node.name, timeout=5) == 1  # the awake one
    assert not processes.alive(default.pid, default.run_id)[0]  # and the sleeper with it


@pytest.mark.parametrize(
    ("reason", "keeps"),
    [
        ("default", True),
        ("active_reservation", True),
        ("manual_override", True),
        ("manual_unload", False),  # staff want the GPU free
        ("stop_for_exclusive", False),  # a whole-card booking needs all of it
    ],
)
def test_what_the_channel_wants_again_is_nothing_when_the_card_must_be_free(
    settings, tiny, ana, reason, keeps
):
    from channels_app.models import ChannelTarget
    from channels_app.node_worker.rows import wanted_of

    settings.SLOTSERVE_SLEEP_MODE = True
    channel = factories.channel("cpu-0", default=tiny.small)
    now = timezone.now()
    factories.reservation(
        owner=ana, on=channel, start=now + timedelta(minutes=5), end=now + timedelta(hours=1), target=tiny.big
    )
    row = ChannelTarget.objects.create(channel=channel, model=None, preset=None, reason=reason)
    returning = wanted_of(channel, row, 0, now).returning
    assert {t.preset_id for t in returning} == ({tiny.small.pk, tiny.big.pk} if keeps else set())
