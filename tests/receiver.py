"""A real HTTP receiver for webhook deliveries: it records each one (headers, body, when it
came) and answers with the statuses it is told, in turn (then the last one, again), after
``delay`` seconds each."""

from __future__ import annotations

import json
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
