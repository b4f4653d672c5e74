"""The gateway's hot-path connection to Redis: one connection, every command pipelined.

Each request the gateway forwards runs two scripts in Redis (in and out, ``gateway.wire.counters``).
Through redis-py's asyncio client those two cost about half of the gateway's CPU per streamed
request and most of the time it adds to the first token (``bench/gateway_bench.py``): a pool
checkout, a retry wrapper, a command packer and a reply parser in Python, and a write of its own
for every command. Here the commands of every request that the same turn of the event loop
handles leave in one write on one connection, and the replies, parsed by hiredis (the C parser
redis-py itself uses when it is installed), come back in order to their callers.

Errors are redis-py's own (``ConnectionError``, ``TimeoutError``, ``ResponseError``,
``NoScriptError``), so callers handle one family whichever client they hold. A command with no
reply within ``timeout`` seconds breaks the connection (its later replies can no longer be
matched): every caller waiting on it hears why, and the next command connects again.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import hiredis
from redis.connection import parse_url
from redis.exceptions import ConnectionError, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

Arg = str | int | bytes


def encode(args: tuple[Arg, ...]) -> bytes:
    """One command in RESP: ``*<n>`` and each argument as a bulk string (hiredis' C packer)."""
    return hiredis.pack_command(cast(Any, args))  # type: ignore[no-any-return]


class _Protocol(asyncio.Protocol):
    def __init__(self, on_lost: Any) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader(replyError=ResponseError)
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.deadlines: deque[float] = deque()  # by when each waiting command must be answered
        self.watchdog: asyncio.TimerHandle | None = None  # looks at the oldest deadline
        self.outgoing: list[bytes] = []  # commands of this turn of the event loop, not sent yet
        self.flush_soon = False  # a flush is due at the end of this turn
        self.in_transit = 0  # commands written and not answered yet
        self.flush_later: asyncio.TimerHandle | None = None  # a flush is due for deferred commands
        self._on_lost = on_lost

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while True:
            try:
                reply = self.reader.gets()
            except hiredis.ProtocolError as exc:
                self.fail(ConnectionError(f"Redis answered something that is not RESP: {exc}"))
                return
            if reply is False:
                return
            if not self.waiting:  # a reply nobody asked for: the stream is out of step
                self.fail(ConnectionError("Redis answered a command nobody sent"))
                return
            future = self.waiting.popleft()
            self.deadlines.popleft()
            self.in_transit -= 1
            if future.done():
                continue  # its caller gave up (cancelled); the reply still had to be read
            if isinstance(reply, ResponseError):
                if str(reply).startswith("NOSCRIPT"):
                    reply = NoScriptError(str(reply))
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(ConnectionError(f"the connection to Redis was lost{f': {exc}' if exc else ''}"))

    def fail(self, error: Exception) -> None:
        """Every caller still waiting hears ``error``; the connection is not used again."""
        self._on_lost(self)
        if self.transport is not None:
            self.transport.abort()
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None
        self.deadlines.clear()
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)


class RespPipe:
    """Commands to one Redis, pipelined on one connection (opened on first use, again after a
    loss). ``call`` returns the reply as redis-py would without ``decode_responses``."""

    def __init__(self, url: str, *, timeout: float = 5.0, connect_timeout: float = 2.0) -> None:
        self.options: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
        self.tls = url.startswith("rediss://")
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None

    async def call(self, *args: Arg, defer: float = 0.0) -> Any:
        """Send a command and wait for its reply. With ``defer`` (seconds) the command may wait
        that long for another to leave with it: a request's count out rides with the next
        request's count in, one write and one wake-up of Redis instead of two."""
        return await self._submit(self._protocol or await self._connect(), args, defer)

    def send_now(self, *args: Arg, defer: float = 0.0) -> asyncio.Future[Any] | None:
        """Queue a command without awaiting anything (it leaves at once, at the end of this
        turn of the event loop, or within ``defer`` as ``call`` says): the future of its reply,
        or None while no connection is open (``call`` opens one)."""
        protocol = self._protocol
        if protocol is None or protocol.transport is None or protocol.transport.is_closing():
            return None
        return self._submit(protocol, args, defer)

    def _submit(self, protocol: _Protocol, args: tuple[Arg, ...], defer: float = 0.0) -> asyncio.Future[Any]:
        """Queue a command on ``protocol``: the future of its reply."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        protocol.waiting.append(future)
        protocol.deadlines.append(loop.time() + self.timeout + defer)
        protocol.outgoing.append(hiredis.pack_command(cast(Any, args)))
        if defer > 0:
            if not protocol.flush_soon and protocol.flush_later is None:
                protocol.flush_later = loop.call_later(defer, self._flush, protocol)
        elif not protocol.in_transit:
            # Redis has nothing of ours to answer: this command leaves now (with any deferred
            # ones), before the caller goes on, so its answer is back the soonest.
            self._flush(protocol)
        elif not protocol.flush_soon:
            # Answers are on their way: what this turn gathers leaves together at its end.
            protocol.flush_soon = True
            loop.call_soon(self._flush, protocol)
        if protocol.watchdog is None:
            protocol.watchdog = loop.call_later(self.timeout + defer, self._watch, protocol)
        return future

    def _watch(self, protocol: _Protocol) -> None:
        """One timer for all waiting commands: the oldest unanswered past its deadline breaks
        the connection (later replies could no longer be matched to their commands)."""
        protocol.watchdog = None
        if not protocol.deadlines:
            return
        loop = asyncio.get_running_loop()
        late = protocol.deadlines[0] - loop.time()
        if late <= 0:
            protocol.fail(RedisTimeoutError(f"Redis did not answer within {self.timeout:g} s"))
        else:
            protocol.watchdog = loop.call_later(late, self._watch, protocol)

    async def evalsha(
        self, script: str, sha: str, keys: Sequence[str], args: Sequence[Arg], *, defer: float = 0.0
    ) -> Any:
        """Run a script by its SHA (Redis keeps it once loaded); load it again after a Redis restart."""
        protocol = self._protocol or await self._connect()
        try:
            return await self._submit(protocol, ("EVALSHA", sha, len(keys), *keys, *args), defer)
        except NoScriptError:
            await self.call("SCRIPT", "LOAD", script)
            return await self.call("EVALSHA", sha, len(keys), *keys, *args)

    def _flush(self, protocol: _Protocol) -> None:
        """Send what this turn of the event loop gathered (and deferred commands), in one write."""
        protocol.flush_soon = False
        if protocol.flush_later is not None:
            protocol.flush_later.cancel()
            protocol.flush_later = None
        if not protocol.outgoing:
            return
        protocol.in_transit += len(protocol.outgoing)
        data, protocol.outgoing = b"".join(protocol.outgoing), []
        if protocol.transport is not None and not protocol.transport.is_closing():
            protocol.transport.write(data)
        else:
            protocol.fail(ConnectionError("the connection to Redis was closed"))

    def _lost(self, protocol: _Protocol) -> None:
        if self._protocol is protocol:
            self._protocol = None

    async def _connect(self) -> _Protocol:
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        options = self.options
        try:
            async with asyncio.timeout(self.connect_timeout):
                if "path" in options:
                    _, protocol = await loop.create_unix_connection(
                        lambda: _Protocol(self._lost), options["path"]
                    )
                else:
                    _, protocol = await loop.create_connection(
                        lambda: _Protocol(self._lost),
                        options.get("host", "localhost"),
                        options.get("port", 6379),
                        ssl=ssl.create_default_context() if self.tls else None,
                    )
        except (OSError, TimeoutError) as exc:
            where = options.get("path") or f"{options.get('host', 'localhost')}:{options.get('port', 6379)}"
            raise ConnectionError(f"cannot connect to Redis at {where}: {exc or 'timed out'}") from None
        # Sign-in and database before anyone else's command.
        if options.get("password"):
            credentials = [options["username"]] if options.get("username") else []
            await self._submit(protocol, ("AUTH", *credentials, options["password"]))
        if options.get("db"):
            await self._submit(protocol, ("SELECT", int(options["db"])))
        self._protocol = protocol
        return protocol

    def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        self._protocol = None


def chain(target: asyncio.Future[Any], source: asyncio.Future[Any]) -> None:
    """``source``'s outcome becomes ``target``'s."""
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif source.exception() is not None:
        target.set_exception(source.exception())  # type: ignore[arg-type]
    else:
        target.set_result(source.result())
