"""One POST to a webhook's receiver within its deadline (``SLOTSERVE_WEBHOOK_TIMEOUT_SECONDS``,
the whole of a try), over a pool of connections a run shares; what came back, or what went wrong
(docs/webhooks.md, "Delivery"). ``reservations.webhooks.delivery`` decides what is sent and when."""

from __future__ import annotations

import math
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx
from django.conf import settings

# The first bytes of an answer the delivery log keeps, and the most of an answer a try reads:
# the rest is never read (a receiver's 200 MB answer costs a worker nothing), and an answer
# longer than that closes its connection rather than returning it to the pool.
ANSWER_KEPT = 500
ANSWER_READ = 64 * 1024


@dataclass(frozen=True)
class Answer:
    status: int | None
    duration_ms: float
    text: str
    error: str


def _tls() -> ssl.SSLContext:
    """One TLS context for every delivery of this process (making one reads the CA bundle)."""
    return httpx.create_ssl_context()


class _Deadline:
    """The moment a try must be over; every step of the connection asks it how long it may take."""

    def __init__(self) -> None:
        self.at = math.inf

    def left(self, timeout: float | None, late: type[Exception]) -> float:
        """``timeout`` cut to what is left of the try; ``late`` raised when nothing is."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise late("the delivery's deadline passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write ends by the try's deadline."""

    def __init__(self, inner: httpcore.NetworkStream, deadline: _Deadline) -> None:
        self._inner, self._deadline = inner, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._deadline.left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._deadline.left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        limit = self._deadline.left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, limit), self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own network backend, each connection's steps cut to the try's deadline."""

    def __init__(self, deadline: _Deadline) -> None:
        self._inner, self._deadline = httpcore.SyncBackend(), deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        limit = self._deadline.left(timeout, httpcore.ConnectTimeout)
        inner = self._inner.connect_tcp(host, port, limit, local_address, socket_options)
        return _DeadlineStream(inner, self._deadline)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.UnsupportedProtocol("webhooks are sent over TCP")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class Sender:
    """Sends a run's deliveries over one pool of connections, each try within its deadline.

    The deadline, ``SLOTSERVE_WEBHOOK_TIMEOUT_SECONDS``, is the whole of a try: connecting,
    sending and reading the answer. A client's timeouts are per step (a receiver that sends a
    byte every few seconds never trips a read timeout), so the connections come from a network
    backend of httpcore's (httpx's own core) whose every read and write is cut to what is left
    of the try, and fails once nothing is. Measured against an event loop cancelling the try,
    this keeps the plain client's pace (``bench/webhook_bench.py``)."""

    def __init__(self) -> None:
        self._deadline = _Deadline()
        timeout = float(settings.SLOTSERVE_WEBHOOK_TIMEOUT_SECONDS)
        self._timeouts = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
        # No proxies from the environment, no redirects followed (httpcore follows none).
        self._pool = httpcore.ConnectionPool(
            ssl_context=_tls(), max_connections=4, network_backend=_DeadlineBackend(self._deadline)
        )

    def post(self, url: str, body: bytes, headers: dict[str, str], extensions: dict[str, str]) -> Answer:
        """One POST; its status and first bytes, or what went wrong."""
        began = time.monotonic()
        whole = float(settings.SLOTSERVE_WEBHOOK_TIMEOUT_SECONDS)
        self._deadline.at = began + whole
        sent = [(name.encode(), value.encode()) for name, value in headers.items()]
        # Answers uncompressed, so that the bytes read are the bytes received.
        sent += [(b"content-length", str(len(body)).encode()), (b"accept-encoding", b"identity")]
        try:
            with self._pool.stream(
                "POST", url, headers=sent, content=body, extensions={"timeout": self._timeouts, **extensions}
            ) as answer:
                first = bytearray()
                for chunk in answer.iter_stream():
                    first += chunk
                    if len(first) >= ANSWER_READ:
                        break
                status = answer.status
        except httpcore.TimeoutException as exc:
            took = time.monotonic() - began
            if took >= whole:
                return Answer(None, took * 1000, "", f"no whole answer within {whole:g} s (the deadline)")
            return Answer(None, took * 1000, "", f"{type(exc).__name__}: {exc}"[:ANSWER_KEPT])
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
            what = type(exc).__name__
            return Answer(None, (time.monotonic() - began) * 1000, "", f"{what}: {exc}"[:ANSWER_KEPT])
        finally:
            self._deadline.at = math.inf
        text = bytes(first[:ANSWER_KEPT]).decode("utf-8", errors="replace")
        return Answer(status, (time.monotonic() - began) * 1000, text, "")

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
