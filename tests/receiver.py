"""A real HTTP receiver for webhook deliveries: it records each one (headers, body, when it
came) and answers with the statuses it is told, in turn (then the last one, again), after
``delay`` seconds each; and one that answers slowly, never, or too much (``SlowReceiver``)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic()

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def msg_id(self) -> str:
        return self.headers["webhook-id"]


class Receiver:
    def __init__(self, statuses: list[int] | None = None, delay: float = 0.0) -> None:
        self.statuses = list(statuses or [200])
        self.delay = delay
        self.received: list[Received] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver._lock:
                    receiver.received.append(
                        Received({k.lower(): v for k, v in self.headers.items()}, body, time.monotonic())
                    )
                    status = receiver.statuses.pop(0) if len(receiver.statuses) > 1 else receiver.statuses[0]
                time.sleep(receiver.delay)
                self.send_response(status)
                self.send_header("content-type", "text/plain")
                self.end_headers()
                self.wfile.write(f"answered {status}".encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def types(self) -> list[str]:
        return [r.json["type"] for r in self.received]


HUNG_UP = ("BrokenPipeError", "ConnectionResetError")


class SlowReceiver:
    """A receiver that misbehaves as a real one can, on a raw socket: ``drip`` answers its
    status and headers, then one byte of its body every ``every`` seconds (never a whole
    answer, never a silence long enough for a read timeout), ``stall`` reads the request and
    never answers, ``huge`` answers 200 at once with a body of ``size`` bytes. ``accepted``
    counts connections; ``written`` counts the bytes of answers that left it; ``ended`` is set
    when an answer stops early, and ``ended_by`` names why (the sender hung up: ``HUNG_UP``; or
    it stopped reading: ``TimeoutError``)."""

    def __init__(self, how: str, every: float = 1.0, size: int = 200 * 1024 * 1024) -> None:
        assert how in ("drip", "stall", "huge"), how
        self.how, self.every, self.size = how, every, size
        self.accepted = 0
        self.written = 0
        self.ended = threading.Event()
        self.ended_by = ""
        self._stop = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}/hook"
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> SlowReceiver:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._server.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(1.0)
            with contextlib.suppress(OSError):
                conn.recv(65536)  # the request (small: one event)
            try:
                if self.how == "huge":
                    conn.sendall(f"HTTP/1.1 200 OK\r\ncontent-length: {self.size}\r\n\r\n".encode())
                    block = b"x" * 65536
                    while self.written < self.size and not self._stop.is_set():
                        conn.settimeout(5.0)
                        conn.sendall(block)
                        self.written += len(block)
                    return
                if self.how == "drip":
                    conn.sendall(f"HTTP/1.1 200 OK\r\ncontent-length: {self.size}\r\n\r\n".encode())
                while not self._stop.wait(self.every):
                    if self.how == "drip":
                        conn.sendall(b"x")
                        self.written += 1
            except OSError as error:
                self.ended_by = type(error).__name__
                self.ended.set()
