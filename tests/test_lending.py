"""Lending a booked model while its booker is idle (docs/gateway.md, "Lending"): opt-in by the
channel and the booker, only the booked model, marked wherever it shows, and the booker first —
their request ends the most recently started borrowed one and starts at once."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from django.db import IntegrityError, transaction
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from channels_app.models import ChannelRuntime
from channels_app.node_worker.worker import in_flight
from gateway.models import RequestLog
from gateway.rules.access import Booking, ChannelView, admit, lends_to, route
from gateway.usage.flush import flush_usage
from gateway.usage.request_log import flush_request_log
from gateway.usage.utilisation import Span, channel_shares
from reservations.models import Reservation
from reservations.services import NewBooking, reservation_change, reservation_create
from slotserve_base.errors import InvalidInput
from slotserve_base.redis_client import redis_client
from tests import factories
from tests.clock import eventually
from tests.conftest import serve, snapshot_seen

T0 = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
ANA, BO = 1, 2


def view(**changes) -> ChannelView:
    booking = Booking(7, ANA, False, T0 + timedelta(hours=1), (3, 4), T0 - timedelta(minutes=5), lends=True)
    channel = ChannelView(
        id=1, name="a100-0", phase="ready", model="qwen", upstream="http://127.0.0.1:1", since=T0,
        load_seconds=30, next_load_seconds=30, drain_seconds=30, switching=False, booking=booking,
        running=(3, 4), places=2,
    )  # fmt: skip
    return replace(channel, **changes)


def test_only_a_lending_slot_running_its_own_model_lends():
    assert lends_to(BO, view()) and admit(caller_id=BO, channel=view(), now=T0) is None
    booking = view().booking
    assert booking is not None
    closed = [
        view(booking=replace(booking, lends=False)),  # the booker or the channel said no: as today
        view(running=(3, 5)),  # another preset runs: not the booked one
        view(fallback=True),  # the default serves the booking meanwhile
        view(phase="draining"),  # the drain at a switch
        view(switching=True),
        view(places=None),  # places unknown: the booker could not end a borrowed request
        view(booking=None, upcoming=booking),  # the preload before the slot: nobody's slot yet
    ]
    for channel in closed:
        assert not lends_to(BO, channel), channel
    refusal = admit(caller_id=BO, channel=view(booking=replace(booking, lends=False)), now=T0)
    assert refusal is not None and (refusal.status, refusal.code) == (403, "gpu_reserved")
    assert not lends_to(ANA, view())  # the booker borrows nothing: the slot is theirs
    # A free channel with the same model goes before a lent one.
    free = view(id=2, name="a100-1", booking=None)
    chosen = route(caller_id=BO, model="qwen", pinned=None, channels=[view(), free], in_flight={2: 5}, now=T0)
    assert chosen.channel is not None and chosen.channel.name == "a100-1"


@pytest.mark.django_db
def test_lending_is_chosen_by_the_channel_and_the_booker_alone(ana, bo, staff):
    channel = factories.channel("a100-0")
    preset = factories.preset(factories.llm("qwen"), "default")
    now = timezone.now()
    slot = {"channel": channel, "start": now + timedelta(hours=1), "end": now + timedelta(hours=2)}
    with pytest.raises(InvalidInput) as refused:
        reservation_create(
            NewBooking(user=ana, model=preset.model, preset=preset, lend=True, **slot), now=now
        )
    assert refused.value.field == "lend" and "does not lend booked time" in str(refused.value)
    channel.lend_while_idle = True
    channel.save()
    with pytest.raises(InvalidInput) as whole_card:
        reservation_create(NewBooking(user=ana, exclusive=True, lend=True, **slot), now=now)
    assert "a whole-card booking runs no model to lend" in str(whole_card.value)
    booking = reservation_create(NewBooking(user=ana, model=preset.model, preset=preset, **slot), now=now)
    assert booking.lend is False  # off unless the booker says so
    with pytest.raises(InvalidInput, match="only the booker chooses"):
        reservation_change(reservation=booking, by=staff, now=now, lend=True)
    assert reservation_change(reservation=booking, by=ana, now=now, lend=True).lend is True
    with pytest.raises(IntegrityError), transaction.atomic():  # the database holds it too
        Reservation.objects.filter(pk=booking.pk).update(exclusive=True, model=None, preset=None)
    api = APIClient()
    api.force_authenticate(bo)
    answer = api.post(
        "/api/reservations/",
        {**{k: factories.iso(v) for k, v in slot.items() if k in ("start", "end")}, "channel": channel.pk,
         "model": "qwen", "lend": "yes please"},
        format="json",
    )  # fmt: skip
    assert answer.status_code == 400 and "lend" in answer.json()


def test_a_minute_only_borrowers_used_is_lent_not_unused():
    """The channel's shares: a booked minute in which only borrowers' requests ran is lent, one
    the booker also used is the booker's, and the shares still add up to the period."""
    minute = timedelta(minutes=1)
    bookings = [Span(T0, T0 + 60 * minute, 1, user_id=ANA, reservation_id=7)]
    requests = [
        Span(T0 + 10 * minute, T0 + 20 * minute, 1, ANA, 7),  # ana's own, 10 min
        Span(T0 + 15 * minute, T0 + 30 * minute, 1, BO, borrowed=True),  # bo's, 10 of them alone
        Span(T0 + 70 * minute, T0 + 75 * minute, 1, BO),  # after the slot: the default
    ]
    shares = channel_shares(
        bookings=bookings, requests=requests, loads=[], lo=T0, hi=T0 + 120 * minute, now=T0 + 120 * minute
    )
    assert shares["served_booker"] == round(10 / 60, 2)
    assert shares["lent"] == round(10 / 60, 2)
    assert shares["booked_idle"] == round(40 / 60, 2)
    assert shares["served_default"] == round(5 / 60, 2)
    assert abs(sum(shares.values()) - 2) < 0.03


def lent_world(
    world, standins, *, lend: bool = True, places: int = 1, prefill_ms: int = 0, chunks: int = 200
):
    """ana's booking of channel b, running the slow model she booked (``chunks`` 20 ms apart,
    whatever a request asks), lent or not; bo borrows."""
    port, _ = standins(
        "slow",
        "--standin-chunks",
        str(chunks),
        "--standin-chunk-delay",
        "20",
        "--standin-prefill-ms",
        str(prefill_ms),
    )
    return booked_on(world, port, places=places, start=timezone.now() - timedelta(minutes=5), lend=lend)


def booked_on(world, port: int, *, places: int, start: datetime, lend: bool) -> Reservation:
    """Channel b (which lends) runs the model ``slow`` on ``port`` with ``places``, and ana has
    booked it, that model and preset, from ``start`` for an hour, lent or not."""
    model = factories.llm("slow")
    preset = factories.preset(model, "default")
    serve(world.other, model, port)
    ChannelRuntime.objects.filter(channel=world.other).update(places=places, preset=preset)
    world.other.lend_while_idle = True
    world.other.save()
    booking = factories.reservation(
        owner=world.ana, on=world.other, start=start, end=start + timedelta(hours=1), target=preset
    )
    Reservation.objects.filter(pk=booking.pk).update(lend=lend)
    booking.refresh_from_db()
    return booking


def chat(url: str, key: str, **extra) -> httpx.Response:
    """A whole (not streamed) chat completion of the slow model."""
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": "slow", "messages": [{"role": "user", "content": "hi"}], **extra},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


class Stream(threading.Thread):
    """A streamed completion in a thread: its status, headers, first data line and last event."""

    def __init__(self, url: str, key: str, **extra) -> None:
        super().__init__(daemon=True)
        self.url, self.key, self.extra = url, key, extra
        self.status: int | None = None
        self.headers: httpx.Headers | None = None
        self.first = math.nan
        self.events: list[str] = []
        self.started = time.monotonic()
        self.start()

    def run(self) -> None:
        body = {
            "model": "slow",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            **self.extra,
        }
        with httpx.stream(
            "POST", self.url + "/v1/chat/completions", json=body,
            headers={"Authorization": f"Bearer {self.key}"}, timeout=60,
        ) as answer:  # fmt: skip
            self.status, self.headers = answer.status_code, answer.headers
            for line in answer.iter_lines():
                if line.startswith("data:"):
                    if math.isnan(self.first):
                        self.first = time.monotonic()
                    self.events.append(line[5:].strip())


def test_with_lending_off_a_colleague_still_gets_403(gateway_url, world, standins):
    lent_world(world, standins, lend=False)
    snapshot_seen(gateway_url)
    answer = chat(gateway_url, world.bo_key)
    assert (answer.status_code, answer.json()["error"]["code"]) == (403, "gpu_reserved")


def test_a_borrower_is_served_while_the_booker_is_idle_and_it_is_marked(gateway_url, world, standins):
    booking = lent_world(world, standins, places=2)
    snapshot_seen(gateway_url)
    answer = chat(gateway_url, world.bo_key, max_tokens=5)
    assert answer.status_code == 200 and answer.headers["x-slotserve-borrowed"] == "true"
    mine = chat(gateway_url, world.ana_key, max_tokens=5)
    assert mine.status_code == 200 and "x-slotserve-borrowed" not in mine.headers
    assert eventually(lambda: (flush_request_log(redis_client()) or True) and RequestLog.objects.count() == 2)
    assert set(RequestLog.objects.values_list("user__username", "borrowed")) == {("bo", True), ("ana", False)}
    # Only ana's request is her booking's use (what the idle rule, her usage and the channel's
    # booked minutes count): bo's row names no booking.
    assert RequestLog.objects.get(user=world.bo).reservation_id is None
    assert RequestLog.objects.get(user=world.ana).reservation_id == booking.pk
    flush_usage(redis_client())
    booking.refresh_from_db()
    assert booking.requests == 1
    # The channel's card says so; bo's request list marks his.
    bo = Client()
    bo.force_login(world.bo)
    assert "lent while ana is idle" in bo.get("/").content.decode()
    assert "(borrowed)" in bo.get("/requests/").content.decode()
    # Usage marks them: bo's borrowed request, the channel's lent one, in the API and the CSV.
    api = APIClient()
    api.force_authenticate(world.bo)
    his = {row["name"]: row["borrowed"] for row in api.get("/api/usage/?by=user").json()["rows"]}
    assert his == {"bo": 1}
    assert "borrowed" in bo.get("/usage/csv").content.decode().splitlines()[0]
    api.force_authenticate(factories.user("boss", staff=True))
    lent = {row["name"]: row["borrowed"] for row in api.get("/api/usage/?by=channel").json()["rows"]}
    assert lent["ch-b"] == 1 and lent.get("ch-a", 0) == 0


def test_the_bookers_request_ends_the_borrowed_stream_and_starts_at_once(gateway_url, world, standins):
    lent_world(world, standins, places=1)
    snapshot_seen(gateway_url)
    borrowed = Stream(gateway_url, world.bo_key, max_tokens=200)
    assert eventually(lambda: in_flight(world.other.pk) == 1 and len(borrowed.events) >= 3, timeout=10)
    mine = Stream(gateway_url, world.ana_key, max_tokens=5)
    mine.join(timeout=30)
    borrowed.join(timeout=30)
    assert mine.status == 200 and mine.first - mine.started < 1.0
    assert borrowed.status == 200 and borrowed.headers is not None
    assert borrowed.headers["x-slotserve-borrowed"] == "true"
    last = json.loads(borrowed.events[-1])
    assert last["error"]["code"] == "preempted_by_booker", borrowed.events[-3:]
    sent = len(borrowed.events) - 1
    assert 3 <= sent < 200  # it ended before its answer did
    assert eventually(lambda: (flush_request_log(redis_client()) or True) and RequestLog.objects.count() == 2)
    row = RequestLog.objects.get(user=world.bo)
    assert row.borrowed and 0 < row.completion_tokens <= sent  # what it was sent, not the 200 asked
    assert row.error_code == "preempted_by_booker"
    # ana sees how much of her slot was lent, and that none of her requests waited.
    ana = Client()
    ana.force_login(world.ana)
    page = ana.get("/reservations/").content.decode()
    assert "Lent: 1 request by others" in page and "none of yours waited" in page
    assert "1 ended early to make room for yours" in page and "place time" not in page  # no jargon


def test_a_borrowed_answer_ended_before_it_began_is_a_503_and_scopes_still_apply(
    gateway_url, world, standins
):
    from gateway.api_keys import api_key_create

    # A whole answer comes after 2 s.
    port, log = standins(
        "slow", "--standin-chunks", "200", "--standin-chunk-delay", "20", "--standin-prefill-ms", "2000"
    )
    booked_on(world, port, places=1, start=timezone.now() - timedelta(minutes=5), lend=True)
    # A key of bo's kept to another channel borrows nothing: the scope applies as ever.
    _, elsewhere = api_key_create(user=world.bo, name="ch-a only", channels=[world.channel])
    snapshot_seen(gateway_url)
    scoped = chat(gateway_url, elsewhere)
    # (its key sees no channel with the model: as for any model outside a key's channels)
    assert (scoped.status_code, scoped.json()["error"]["code"]) == (404, "model_not_loaded")
    # A whole answer (not streamed) ended by the booker's request: a 503 in its API's shape.
    answers: list[httpx.Response] = []
    whole = threading.Thread(target=lambda: answers.append(chat(gateway_url, world.bo_key, max_tokens=200)))
    whole.start()
    assert eventually(lambda: in_flight(world.other.pk) == 1, timeout=10)
    assert eventually(lambda: "generating for" in log.read_text(), timeout=10)  # under way in the process
    mine = Stream(gateway_url, world.ana_key, max_tokens=5)
    mine.join(timeout=30)
    whole.join(timeout=30)
    assert mine.status == 200
    [ended] = answers
    assert ended.status_code == 503 and ended.headers["retry-after"] == "0"
    assert ended.json()["error"]["code"] == "preempted_by_booker"
    assert ended.headers["x-slotserve-borrowed"] == "true"


@pytest.mark.django_db
def test_the_booking_form_offers_lending_where_the_channel_lends(ana):
    lends, keeps = factories.channel("lends"), factories.channel("keeps")
    lends.lend_while_idle = True
    lends.save()
    preset = factories.preset(factories.llm("qwen"), "default")
    person = Client()
    person.force_login(ana)
    assert f'"lends": ["{lends.pk}"]' in person.get("/book/").content.decode()  # the form shows it there
    start = timezone.localtime(timezone.now() + timedelta(days=1)).replace(hour=10, minute=0, second=0)

    def book(channel, hours: int) -> str:
        form = {
            "channel": channel.pk,
            "start": (start + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M"),
            "end": (start + timedelta(hours=hours + 1)).strftime("%Y-%m-%dT%H:%M"),
            "model": preset.model_id,
            "preset": preset.pk,
            "lend": "on",
        }
        return person.post("/book/", form, follow=True).content.decode()

    assert "does not lend booked time" in book(keeps, 0)
    assert not Reservation.objects.filter(channel=keeps).exists()
    book(lends, 2)
    assert Reservation.objects.get(channel=lends).lend is True
    # The calendar tells colleagues which slots to come they may use while ana is idle.
    bo = Client()
    bo.force_login(factories.user("bo"))
    day = bo.get("/calendar/", {"day": start.date().isoformat()}).content.decode()
    [block] = [b for b in day.split("<button")[1:] if 'class="res ' in b]
    assert "lends" in block.split('class="')[1].split('"')[0] and "(lent while ana is idle)" in block
    Reservation.objects.filter(channel=lends).update(lend=False)  # taken back: no longer said
    day = bo.get("/calendar/", {"day": start.date().isoformat()}).content.decode()
    assert "lent while" not in day and "res approved lends" not in day


def test_borrowers_wait_their_turn_fairly_under_their_own_limits_and_the_booker_waits_for_none(
    gateway_url, world, standins
):
    """Borrowed requests share the lent slot through the channel's fair queue (tokens, not
    requests, are shared among borrowers) and under each borrower's limits; the booker's request
    takes no turn in that queue."""
    from gateway.api_keys import api_key_create
    from gateway.models import SharingLimits
    from tests.test_fair_sharing import waiting_on

    lent_world(world, standins, places=1, chunks=150)  # an answer takes 3 s
    cy = factories.user("cy")
    _, cy_key = api_key_create(user=cy, name="t")
    SharingLimits.objects.create(user=cy, requests_per_minute=1)
    snapshot_seen(gateway_url)
    running = Stream(gateway_url, world.bo_key, max_tokens=60)  # (the stand-in sends 150 chunks)
    assert eventually(lambda: in_flight(world.other.pk) == 1, timeout=10)
    bos = [Stream(gateway_url, world.bo_key, max_tokens=60) for _ in range(2)]
    assert eventually(lambda: waiting_on(world.other) == 2, timeout=10)
    cys = Stream(gateway_url, cy_key, max_tokens=16)
    assert eventually(lambda: waiting_on(world.other) == 3, timeout=10)
    # ana, the booker, waits behind none of the three: her request ends the borrowed one.
    mine = Stream(gateway_url, world.ana_key, max_tokens=5)
    for stream in [running, *bos, cys, mine]:
        stream.join(timeout=30)
    assert mine.status == 200 and mine.first - mine.started < 1.0
    assert json.loads(running.events[-1])["error"]["code"] == "preempted_by_booker"
    assert [s.status for s in [*bos, cys]] == [200] * 3
    # cy came after bo's two waiting requests, asked fewer tokens, and went first.
    assert cys.first < min(s.first for s in bos)
    # Each says it was borrowed, bo's though they waited long enough (over 5 s) for the head of
    # their answer to be sent while they waited.
    assert all(s.headers is not None and s.headers["x-slotserve-borrowed"] == "true" for s in [*bos, cys])
    assert max(s.first - s.started for s in bos) > 5
    # cy's limit holds on a lent slot as anywhere: one request a minute.
    over = chat(gateway_url, cy_key, max_tokens=5)
    assert (over.status_code, over.json()["error"]["code"]) == (429, "rate_limit_exceeded"), over.text


def _two_gateways(listen_url: str | None = None):
    """Two gateway processes' lending: one holds a borrowed request (listening at ``listen_url``,
    Redis' unless given), the other serves its booker."""
    from django.conf import settings as django_settings

    from gateway.wire.counters import Counters
    from gateway.wire.lending import Lending

    url = django_settings.REDIS_URL
    return Lending(Counters(url), listen_url or url), Lending(Counters(url), url)


async def _until(what, seconds: float = 2.0) -> bool:
    for _ in range(int(seconds / 0.01)):
        if what():
            return True
        await asyncio.sleep(0.01)
    return bool(what())


async def _booker_ends(holding, booker, channel: int, request_id: str, ended: list[float]) -> float:
    """The booker's request, counted in on a full channel, ends the borrowed one: when it asked
    (``ended`` gets when the holding gateway ended it)."""
    asked = time.perf_counter()
    assert await booker.make_room(channel, 0) == [request_id]
    await _until(lambda: bool(ended), 0.5)
    await holding.returned(channel, request_id, marked=True)
    return asked


def _borrowed_in_flight(channel: int, request_id: str) -> None:
    from gateway.wire.counter_scripts import key
    from slotserve_base.vocabulary import RedisKey

    redis_client().zadd(key(RedisKey.INFLIGHT, channel), {request_id: time.time() + 60})


def test_a_borrowed_request_hears_at_once_that_the_booker_ended_it(monkeypatch):
    """The gateway that holds a borrowed request hears the preemption another gateway's booker
    request made (Redis pub/sub), within milliseconds: no look for its mark needed."""
    from gateway.wire import lending as wire

    monkeypatch.setattr(wire, "BACKSTOP_SECONDS", 60.0)  # only the message can end it in time
    ended: list[float] = []

    async def run() -> float:
        holding, booker = _two_gateways()
        looks: list[float] = []
        first_look = holding._look

        async def look() -> None:
            await first_look()
            looks.append(time.perf_counter())

        holding._look = look
        _borrowed_in_flight(41, "b1")
        await holding.lent(41, "b1", lambda: ended.append(time.perf_counter()))
        # Listening, and past its first look for marks (the next is a minute away).
        assert await _until(lambda: holding.listening and bool(looks))
        return await _booker_ends(holding, booker, 41, "b1", ended)

    asked = asyncio.run(run())
    assert ended and ended[0] - asked < 0.1, ended


def test_a_gateway_that_cannot_listen_still_ends_a_borrowed_request_by_its_mark(caplog):
    ended: list[float] = []

    async def run() -> float:
        # Its listening connection goes nowhere; its counters reach Redis.
        deaf, booker = _two_gateways("redis://127.0.0.1:1/0")
        _borrowed_in_flight(42, "b2")
        await deaf.lent(42, "b2", lambda: ended.append(time.perf_counter()))
        assert await _until(lambda: "not listening for preemptions" in caplog.text)
        assert not deaf.listening
        return await _booker_ends(deaf, booker, 42, "b2", ended)

    asked = asyncio.run(run())
    assert ended and ended[0] - asked < 0.2, ended
    assert "not listening for preemptions" in caplog.text


def test_after_redis_restarts_the_booker_still_ends_a_borrowed_request_in_flight(monkeypatch):
    """Redis restarted loses the channel's lent set: the gateway that holds a borrowed request
    keeps it there again as soon as it listens anew, so the booker's next request still ends it."""
    from gateway.wire import lending as wire
    from gateway.wire.counter_scripts import key
    from slotserve_base.vocabulary import RedisKey

    monkeypatch.setattr(wire, "RELISTEN_SECONDS", 0.1)
    ended: list[float] = []
    client = redis_client()

    async def run() -> None:
        holding, booker = _two_gateways()
        _borrowed_in_flight(44, "b4")
        await holding.lent(44, "b4", lambda: ended.append(time.perf_counter()))
        assert await _until(lambda: holding.listening)
        # As a Redis restart would: the lent set is gone, and so is the listening connection.
        client.delete(key(RedisKey.LENT, 44))
        [listener] = [c for c in client.client_list() if c.get("name") == holding._published()]
        client.client_kill_filter(_id=listener["id"])
        assert await _until(lambda: not holding.listening)
        assert await _until(lambda: holding.listening)
        assert await _until(lambda: client.zscore(key(RedisKey.LENT, 44), "b4") is not None)
        await _booker_ends(holding, booker, 44, "b4", ended)

    asyncio.run(run())
    assert ended


def test_a_request_whose_turn_comes_after_the_slot_began_is_borrowed(gateway_url, world, standins):
    """A request that waited its turn from before a lent slot into it is let in as a borrowed one
    (the access table asked again when its turn comes): marked, and the booker's to end. The
    chaos day found one let in unmarked, as if the slot had not begun."""
    booking = lent_world(world, standins, places=1, chunks=100)  # an answer takes 2 s
    start = timezone.now() + timedelta(seconds=1.5)
    Reservation.objects.filter(pk=booking.pk).update(start=start)
    snapshot_seen(gateway_url)
    before = Stream(gateway_url, world.bo_key)  # the preload window: nobody's slot yet
    assert eventually(lambda: in_flight(world.other.pk) == 1, timeout=10)
    waiting = Stream(gateway_url, world.bo_key)  # its turn comes when the first ends, in the slot
    before.join(timeout=30)
    waiting.join(timeout=30)
    assert (
        before.status == 200
        and before.headers is not None
        and before.started < start.timestamp() + (time.monotonic() - time.time())
    )
    assert "x-slotserve-borrowed" not in before.headers
    assert waiting.status == 200 and waiting.headers is not None
    assert waiting.headers.get("x-slotserve-borrowed") == "true"
    assert eventually(lambda: (flush_request_log(redis_client()) or True) and RequestLog.objects.count() == 2)
    # The first ran on into the slot: from its first moment it was borrowed too (docs/gateway.md,
    # "A slot's first second"), though its head went out before the slot, unmarked.
    assert sorted(RequestLog.objects.values_list("borrowed", flat=True)) == [True, True]


def test_a_borrowed_whole_answer_goes_up_as_a_stream_and_ends_at_once(
    llama_server_bin, tiny_gguf, transactional_db, world, settings
):
    """A borrowed request that asked for a whole answer goes to the process as a stream and is
    made whole in the gateway: its caller gets what the process answers such a request, and the
    booker's request that ends it does not wait for the process to notice a gone client (about
    half a second for a request that is not streamed)."""
    from gateway.serve.proxy import Gateway
    from tests.conftest import running_llama_server, serving

    settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS = 0.2
    args = ("-np", "1", "-c", "512", "-t", "1", "--context-shift")
    with running_llama_server(llama_server_bin, tiny_gguf, *args) as port, serving(Gateway()) as url:
        booked_on(world, port, places=1, start=timezone.now() - timedelta(minutes=1), lend=True)
        snapshot_seen(url)
        asked = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 24,
            "temperature": 0,
            "seed": 7,
        }
        direct = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=asked, timeout=30).json()
        whole = chat(url, world.bo_key, **asked)
        assert whole.status_code == 200 and whole.headers["x-slotserve-borrowed"] == "true"
        assert whole.headers["content-type"].startswith("application/json")
        made = whole.json()
        assert made["object"] == "chat.completion"
        assert made["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
        assert made["choices"][0]["finish_reason"] == direct["choices"][0]["finish_reason"]
        assert made["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"] == 24
        # A long whole answer, borrowed; the booker's stream ends it and starts at once.
        answers: list[httpx.Response] = []
        long = {"max_tokens": 20000, "ignore_eos": True}
        borrowed = threading.Thread(target=lambda: answers.append(chat(url, world.bo_key, **long)))
        borrowed.start()
        assert eventually(lambda: in_flight(world.other.pk) == 1, timeout=10)

        def generating() -> bool:  # under way in the process: its one slot is busy
            slots = httpx.get(f"http://127.0.0.1:{port}/slots", timeout=5).json()
            return any(slot["is_processing"] for slot in slots)

        assert eventually(generating, timeout=10)
        mine = Stream(url, world.ana_key, max_tokens=4)
        mine.join(timeout=30)
        borrowed.join(timeout=30)
        assert mine.status == 200
        [ended] = answers
        assert ended.status_code == 503 and ended.json()["error"]["code"] == "preempted_by_booker"
        wait = mine.first - mine.started
        print(f"the booker's first token after ending a borrowed whole answer: {wait * 1000:.0f} ms")
        assert wait < 0.4  # not the process's half-second look for a gone client


def test_an_answer_made_whole_from_a_stream_keeps_tool_calls_reasoning_and_completions():
    from gateway.stream.assembled import Assembly, may_assemble

    assert may_assemble("/v1/chat/completions", {"messages": []})
    assert not may_assemble("/v1/chat/completions", {"stream": True})
    assert not may_assemble("/v1/embeddings", {"input": "x"})
    events = [
        {"id": "c1", "object": "chat.completion.chunk", "created": 5, "model": "m",
         "choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "think "}}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"reasoning_content": "more"}}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "get_", "arguments": '{"ci'}}]}}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"name": "weather", "arguments": 'ty": "Oslo"}'}}]}}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12},
         "timings": {"predicted_n": 9}},
    ]  # fmt: skip
    stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    assembly = Assembly()
    for cut in range(0, len(stream), 37):  # in pieces, as a transport delivers them
        assembly.feed(stream[cut : cut + 37])
    made = json.loads(assembly.answer())
    assert (made["id"], made["object"], made["created"], made["model"]) == ("c1", "chat.completion", 5, "m")
    [choice] = made["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == "think more" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {
            "type": "function",
            "id": "call_1",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
    ]
    assert made["usage"]["completion_tokens"] == 9 and made["timings"] == {"predicted_n": 9}
    text = Assembly()
    text.feed(
        b'data: {"id": "t", "object": "text_completion", "choices": [{"index": 0, "text": "he"}]}\n\n'
        b'data: {"id": "t", "object": "text_completion", "choices": [{"index": 0, "text": "llo", '
        b'"finish_reason": "length"}]}\n\n'
    )
    assert json.loads(text.answer())["choices"] == [
        {"index": 0, "finish_reason": "length", "text": "hello", "logprobs": None}
    ]
