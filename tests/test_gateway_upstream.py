"""The gateway's own pieces under its hot path: the upstream transport (against real sockets that
misbehave on purpose), the server-sent-event reader, and the batched Redis counters."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable

import httpx
import pytest
from django.conf import settings

from gateway.stream.events import Events, Usage
from gateway.wire.counters import GATE, INFLIGHT, Counters, key
from gateway.wire.upstream import HIGH_WATER, Cancel, UpstreamTransport, client_for

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Upstream:
    """A TCP server on a free port that counts its connections and hands each to ``handler``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the test is over, or its client went away
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    return head + await reader.readexactly(length)


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def post(
    transport: UpstreamTransport, body: bytes = b"{}", cancel: Cancel | None = None
) -> httpx.Response:
    request = httpx.Request(
        "POST",
        transport.url("/v1/chat/completions"),
        content=body,
        headers={"content-type": "application/json"},
        extensions={"slotserve.cancel": cancel} if cancel else {},
    )
    return await transport.handle_async_request(request)


async def body_of(response: httpx.Response) -> list[bytes]:
    stream = response.stream
    assert isinstance(stream, httpx.AsyncByteStream)
    try:
        return [chunk async for chunk in stream]
    finally:
        await response.aclose()


def test_keep_alive_connections_are_reused_and_requests_arrive_whole():
    seen: list[bytes] = []

    async def handler(reader, writer):
        while True:
            seen.append(await read_request(reader))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")

    async def main():
        upstream = Upstream(handler)
        async with upstream as url:
            transport = UpstreamTransport(url)
            for _ in range(3):
                response = await post(transport, b'{"model":"m"}')
                assert response.status_code == 200
                assert b"".join(await body_of(response)) == b"{}"
            await transport.aclose()
        return upstream.connections

    assert asyncio.run(main()) == 1
    assert len(seen) == 3
    assert seen[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"content-length: 13\r\n" in seen[0].lower() and seen[0].endswith(b'\r\n\r\n{"model":"m"}')


def test_a_stream_arrives_chunk_by_chunk_as_the_upstream_sends_it():
    async def main():
        release = asyncio.Event()

        async def handler(reader, writer):
            await read_request(reader)
            writer.write(STREAM_HEAD + b"8\r\ndata: 1\n\r\n")
            await writer.drain()
            await release.wait()  # the second token only once the first was received
            writer.write(b"8\r\ndata: 2\n\r\n0\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(1)

        async with Upstream(handler) as url:
            transport = UpstreamTransport(url)
            response = await post(transport)
            stream = response.stream
            assert isinstance(stream, httpx.AsyncByteStream)
            received = []
            async for chunk in stream:
                received.append(chunk)
                release.set()
            await response.aclose()
            assert transport.idle, "a stream read to its end gives its connection back"
            return received

    assert asyncio.run(main()) == [b"data: 1\n", b"data: 2\n"]


def test_an_answer_ended_by_closing_the_connection_is_read_whole():
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()

    async def main():
        async with Upstream(handler) as url:
            transport = UpstreamTransport(url)
            response = await post(transport)
            body = b"".join(await body_of(response))
            return body, transport.idle

    body, idle = asyncio.run(main())
    assert body == b"all of it"
    assert idle == [], "a connection the upstream closed is not kept"


def test_an_idle_connection_the_upstream_dropped_is_replaced_without_an_error():
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        # Like uvicorn's keep-alive timeout: the idle connection is closed after the answer.

    async def main():
        upstream = Upstream(handler)
        async with upstream as url:
            transport = UpstreamTransport(url)
            assert b"".join(await body_of(await post(transport))) == b"ok"
            await asyncio.sleep(0.05)
            assert b"".join(await body_of(await post(transport))) == b"ok"
        return upstream.connections

    assert asyncio.run(main()) == 2


def test_cancel_closes_the_connection_while_the_upstream_is_still_thinking():
    async def main():
        gone = asyncio.Event()

        async def handler(reader, writer):
            await read_request(reader)
            # No answer yet (a long prefill); the connection closing is the cancel.
            assert await reader.read(1) == b""
            gone.set()

        async with Upstream(handler) as url:
            transport = UpstreamTransport(url)
            cancel = Cancel()
            asyncio.get_running_loop().call_later(0.1, cancel.fire)
            with pytest.raises(httpx.ReadError):
                await post(transport, cancel=cancel)
            await asyncio.wait_for(gone.wait(), 5)
            return transport.idle

    assert asyncio.run(main()) == []


def test_a_stream_left_unfinished_is_closed_not_reused():
    async def main():
        gone = asyncio.Event()

        async def handler(reader, writer):
            await read_request(reader)
            writer.write(STREAM_HEAD + b"8\r\ndata: 1\n\r\n")
            await writer.drain()
            assert await reader.read(1) == b""
            gone.set()

        async with Upstream(handler) as url:
            transport = UpstreamTransport(url)
            response = await post(transport)
            stream = response.stream
            assert isinstance(stream, httpx.AsyncByteStream)
            async for _ in stream:
                break
            await response.aclose()
            await asyncio.wait_for(gone.wait(), 5)
            return transport.idle

    assert asyncio.run(main()) == []


def test_upstream_failures_are_httpx_errors():
    async def garbage(reader, writer):
        await read_request(reader)
        writer.write(b"this is not HTTP\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async def dies_mid_stream(reader, writer):
        await read_request(reader)
        writer.write(STREAM_HEAD + b"8\r\ndata: 1\n\r\n")
        await writer.drain()

    async def main():
        async with Upstream(garbage) as url:
            with pytest.raises(httpx.RemoteProtocolError, match="not valid HTTP"):
                await post(UpstreamTransport(url))
        async with Upstream(dies_mid_stream) as url:
            response = await post(UpstreamTransport(url))
            with pytest.raises(httpx.ReadError, match="closed the connection"):
                await body_of(response)
        with contextlib.closing(__import__("socket").socket()) as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with pytest.raises(httpx.ConnectError, match="cannot connect"):
            await post(UpstreamTransport(f"http://127.0.0.1:{port}"))

    asyncio.run(main())


def test_a_slow_reader_pauses_the_upstream_instead_of_buffering_everything():
    async def main():
        big = b"x" * (HIGH_WATER * 128)
        sent = asyncio.Event()

        async def handler(reader, writer):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(big) + big)
            await writer.drain()
            sent.set()

        async with Upstream(handler) as url:
            transport = UpstreamTransport(url)
            response = await post(transport)
            await asyncio.sleep(0.3)  # nobody reads
            stream = response.stream
            assert isinstance(stream, httpx.AsyncByteStream)
            connection = stream.connection  # type: ignore[attr-defined]
            buffered_while_paused = connection.buffered
            drained_early = sent.is_set()
            total = sum(len(chunk) for chunk in await body_of(response))
            return buffered_while_paused, drained_early, total

    buffered, drained_early, total = asyncio.run(main())
    assert buffered < HIGH_WATER * 2
    assert not drained_early, "the upstream waits while the gateway holds back"
    assert total == HIGH_WATER * 128


def test_an_httpx_client_works_over_the_transport():
    async def handler(reader, writer):
        while True:
            request = await read_request(reader)
            body = b'{"path": "%s"}' % request.split(b" ")[1]
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
                + body
            )

    async def main():
        async with Upstream(handler) as url, client_for(url) as client:
            first = await client.get("/v1/models")
            second = await client.post("/v1/embeddings", json={"input": "hi"})
            return first.json(), second.json()

    assert asyncio.run(main()) == ({"path": "/v1/models"}, {"path": "/v1/embeddings"})


# --- Server-sent events ---------------------------------------------------------------------------


def test_events_pass_whole_events_and_hold_a_part_until_its_rest_arrives():
    events = Events(Usage(), strip_usage=False)
    assert events.feed(b"data: 1\n\ndata: ") == b"data: 1\n\n"
    assert events.feed(b"2\n") == b""
    assert events.feed(b"\ndata: 3\n\n") == b"data: 2\n\ndata: 3\n\n"
    assert events.feed(b"data: 4\r\n\r\n") == b"data: 4\r\n\r\n"
    assert events.feed(b"data: [DO") == b""
    assert events.flush() == b"data: [DO"


def test_events_read_usage_split_across_reads_and_hide_the_chunk_nobody_asked_for():
    usage = Usage()
    events = Events(usage, strip_usage=True)
    usage_event = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7}}\n\n'
    out = events.feed(b'data: {"choices":[{"delta":{}}]}\n\n' + usage_event[:20])
    out += events.feed(usage_event[20:] + b"data: [DONE]\n\n")
    assert out == b'data: {"choices":[{"delta":{}}]}\n\ndata: [DONE]\n\n'
    assert (usage.prompt, usage.completion) == (5, 7)

    kept = Events(Usage(), strip_usage=False)
    assert kept.feed(usage_event) == usage_event, "a client that asked for usage gets it"


def test_a_body_without_event_boundaries_is_not_held_forever():
    events = Events(Usage(), strip_usage=False)
    blob = b"x" * (Events.LIMIT + 1)
    assert events.feed(blob) == blob


# --- Counters -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_requests_arriving_together_are_counted_in_one_batch_each_with_its_own_answer():
    import redis

    plain = redis.Redis.from_url(settings.REDIS_URL)
    plain.set(key(GATE, 2), "1")

    async def main():
        counters = Counters(settings.REDIS_URL)
        tickets = await asyncio.gather(*(counters.enter(1 + i % 2) for i in range(10)))
        admitted = [t is not None for t in tickets]
        in_flight = await counters.in_flight([1, 2])
        await asyncio.gather(
            *(
                counters.leave(1, t, user_id=7, reservation_id=None, prompt=3, completion=4)
                for t in tickets
                if t is not None
            )
        )
        after = await counters.in_flight([1, 2])
        counters.close()
        return admitted, in_flight, after

    admitted, in_flight, after = asyncio.run(main())
    assert admitted == [True, False] * 5
    assert in_flight == {1: 5, 2: 0}, "a refused request is never counted in"
    assert after == {1: 0, 2: 0}
    usage = {k.decode(): int(v) for k, v in plain.hgetall(key("usage:user", 7)).items()}
    assert usage == {"requests": 5, "prompt_tokens": 15, "completion_tokens": 20}
    assert plain.zcard(key(INFLIGHT, 1)) == 0


@pytest.mark.django_db
def test_a_caller_may_go_ahead_of_its_count_in_for_half_its_room_and_not_for_long(monkeypatch):
    """``may_go_ahead``: after a count in that left room for three more requests (a limit of
    four at once), one request may go up before its count in is known; then none. Room noted
    over a second ago counts for nothing; a count in over a limit takes the room away."""
    from gateway.rules.callers import Limits
    from gateway.wire import counters as counting
    from gateway.wire.counter_scripts import OverLimit

    limits = Limits(
        user_concurrent=4, key_concurrent=0, user_per_minute=0, key_per_minute=0, user_weekly_tokens=0
    )

    async def main():
        counters = Counters(settings.REDIS_URL)
        seen = [counters.may_go_ahead(8, 9)]  # nothing known of the caller yet
        first = await counters.enter(1, limits, user_id=8, key_id=9)
        seen += [counters.may_go_ahead(8, 9), counters.may_go_ahead(8, 9)]
        ahead = await counters.enter_soon(1, limits, user_id=8, key_id=9)  # counted like any
        clock = time.monotonic() + counting.ROOM_SECONDS
        monkeypatch.setattr("gateway.wire.counters.time.monotonic", lambda: clock)
        seen.append(counters.may_go_ahead(8, 9))  # its answer left one place, but a second ago
        monkeypatch.undo()
        seen.append(counters.may_go_ahead(8, 9))  # now: room for two, one place
        more = [await counters.enter(1, limits, user_id=8, key_id=9) for _ in range(2)]
        try:
            await counters.enter(1, limits, user_id=8, key_id=9)
        except OverLimit as over:
            refused = over.limit
        seen.append(counters.may_go_ahead(8, 9))
        for ticket in (first, ahead, *more):
            await counters.leave(1, ticket, user_id=8, key_id=9, reservation_id=None, prompt=0, completion=0)
        counters.close()
        return seen, refused

    seen, refused = asyncio.run(main())
    assert seen == [False, True, False, False, True, False]
    assert refused == "user_concurrent"


def test_an_unreachable_redis_fails_each_waiting_request():
    import redis

    with contextlib.closing(__import__("socket").socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def main():
        counters = Counters(f"redis://127.0.0.1:{port}/0")
        results = await asyncio.gather(counters.enter(1), counters.enter(2), return_exceptions=True)
        return results

    results = asyncio.run(main())
    assert len(results) == 2 and all(isinstance(r, redis.ConnectionError) for r in results)


# --- Snapshot -------------------------------------------------------------------------------------


@pytest.mark.parametrize("read_seconds", [0.02, 0.16])
def test_the_snapshot_is_kept_fresh_in_the_background_and_requests_do_not_wait(monkeypatch, read_seconds):
    import time

    from gateway.admit import snapshot as snapshots

    max_age = 0.4
    reads = []

    def slow_read():
        reads.append(time.monotonic())
        # A database read: quick (a twentieth of the age limit), or slow (0.16 s: started at
        # three quarters of the limit it would end past it); the keeper starts it early enough.
        time.sleep(read_seconds)
        return snapshots.Snapshot(taken_at=time.monotonic())

    monkeypatch.setattr(snapshots, "read_snapshot", slow_read)
    monkeypatch.setattr(snapshots.SnapshotCache, "IDLE_STOP", 0.3)

    async def main():
        cache = snapshots.SnapshotCache(max_age=max_age)
        await cache.get()  # the first request waits for the first read
        fresh = cache.fresh

        def looked() -> snapshots.Snapshot | None:  # a request waits exactly when it finds none fresh
            found = fresh()
            if found is None:
                stale.append(time.monotonic())
            return found

        stale: list[float] = []
        cache.fresh = looked  # type: ignore[method-assign]
        waits, ages = [], []
        for _ in range(100):
            started = time.monotonic()
            current = await cache.get()
            waits.append(time.monotonic() - started)
            ages.append(time.monotonic() - current.taken_at)
            await asyncio.sleep(0.02)
        reads_while_busy = len(reads)
        # No requests: the keeper stops (IDLE_STOP after the last), within a few of its reads.
        stopped_by = time.monotonic() + 5
        while not (cache._keeper is not None and cache._keeper.done()) and time.monotonic() < stopped_by:
            await asyncio.sleep(0.02)
        return waits, ages, reads_while_busy, len(reads), cache._keeper, stale

    waits, ages, busy, total, keeper, stale = asyncio.run(main())
    # Whether a request waited is what the cache did, not how long it took (a loaded machine
    # pauses the loop now and then): none found the snapshot stale, so none waited for a read.
    assert stale == [], f"{len(stale)} request(s) waited for a read (the longest wait {max(waits):.3f} s)"
    assert max(ages) < max_age, "and none saw a snapshot past its age limit"
    assert busy >= 5, "the snapshot was read again and again while requests came"
    assert total - busy <= 2 and keeper.done(), "an idle gateway stops reading"


# --- The hot path's Redis connection ---------------------------------------------------------------


def test_the_pipe_selects_its_database_reloads_forgotten_scripts_and_fails_waiters_clearly():
    """``gateway.wire.redis_protocol``: the URL's database is selected before any command; a script Redis
    forgot (a restart) is loaded again; a Redis that stops answering fails every waiting command
    with redis-py's TimeoutError, and the next command connects afresh."""
    import socket as sockets
    import threading

    import redis

    from gateway.wire.redis_protocol import RespPipe

    base = settings.REDIS_URL.rsplit("/", 1)[0]
    other_db = redis.Redis.from_url(f"{base}/3")
    name = f"resp-test-{uuid.uuid4().hex}"
    script = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
    sha = hashlib.sha1(script.encode()).hexdigest()

    async def main():
        pipe = RespPipe(f"{base}/3")
        together = await asyncio.gather(*(pipe.evalsha(script, sha, [name], [2]) for _ in range(5)))
        await pipe.call("SCRIPT", "FLUSH")
        after_flush = await pipe.evalsha(script, sha, [name], [10])
        mget = await pipe.call("MGET", name, "missing")
        pipe.close()
        return together, after_flush, mget

    try:
        together, after_flush, mget = asyncio.run(main())
        assert sorted(together) == [2, 4, 6, 8, 10]
        assert after_flush == 20 and mget == [b"20", None]
        assert int(other_db.get(name)) == 20
    finally:
        other_db.delete(name)

    # A server that accepts and never answers.
    silent = sockets.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    accepted: list[sockets.socket] = []
    threading.Thread(target=lambda: accepted.append(silent.accept()[0]), daemon=True).start()

    async def stuck():
        pipe = RespPipe(f"redis://127.0.0.1:{silent.getsockname()[1]}/0", timeout=0.3)
        results = await asyncio.gather(pipe.call("GET", "a"), pipe.call("GET", "b"), return_exceptions=True)
        return results, pipe._protocol

    results, protocol = asyncio.run(stuck())
    silent.close()
    assert all(isinstance(r, redis.TimeoutError) for r in results), results
    assert protocol is None, "a connection that timed out is not used again"


def test_requests_that_wait_on_a_slow_database_share_one_read(monkeypatch):
    """A database slower than the snapshot's age limit: the requests waiting meanwhile take the
    read that ended while they waited, rather than each reading again in turn."""
    from gateway.admit import snapshot as snapshots

    reads = []

    def slow_read():
        started = time.monotonic()
        reads.append(started)
        time.sleep(0.3)  # three times the age limit
        return snapshots.Snapshot(taken_at=started)

    monkeypatch.setattr(snapshots, "read_snapshot", slow_read)

    async def main():
        cache = snapshots.SnapshotCache(max_age=0.1)
        await asyncio.gather(*(cache.get() for _ in range(20)))
        cache._keeper.cancel()

    asyncio.run(main())
    assert len(reads) <= 3, f"{len(reads)} reads for 20 waiting requests"
