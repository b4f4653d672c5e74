"""A stand-in inference server for machines without a GPU.

    python -m devtools.standin -m PATH --host H --port P --alias NAME [options]        # llama.cpp
    python -m devtools.standin serve PATH --host H --port P --served-model-name NAME   # vLLM
    python -m devtools.standin --model-path PATH --host H --port P --served-model-name NAME  # SGLang

It accepts the command lines SlotServe gives each backend, answers
``GET /health`` (503 while "loading", then 200) and the OpenAI endpoints
(``/v1/models``, ``/v1/chat/completions`` with streaming, ``/v1/completions``,
``/v1/embeddings``). Like the real programs, it fails when the model path
does not exist, and with an API key (``--api-key``, ``LLAMA_API_KEY`` in the
llama.cpp form, ``VLLM_API_KEY`` in the vLLM form, or ``api-key:`` in a
``--config`` file as SGLang reads it) it answers every request but
``/health`` and ``/v1/models`` with 401 unless the key is sent.
Options, given in a preset, make it misbehave on purpose:

    --standin-load-seconds S   /health answers 503 for S seconds (default 0.2)
    --standin-hang             never becomes healthy
    --standin-crash-after S    exits with status 1 S seconds into its first completion (mid-stream)
    --standin-oom              prints a CUDA out-of-memory error while loading and exits 1
    --standin-ignore-sigterm   needs SIGKILL to stop
    --standin-chunks N         tokens per streamed answer (default 16)
    --standin-chunk-delay MS   pause between streamed tokens (default 0)
    --standin-prefill-ms MS    think this long before answering, giving up if the client hangs up
    --standin-sleep-seconds S  vLLM's sleep and wake take this long (default 0.05)
    --standin-wake-oom         vLLM's wake fails as when the GPU's memory was taken meanwhile

In vLLM's form it keeps vLLM's sleep mode: with ``--enable-sleep-mode`` and
``VLLM_SERVER_DEV_MODE=1``, ``POST /sleep?level=1|2``, ``POST /wake_up`` and ``GET /is_sleeping``;
like vLLM, its key guards the paths under ``/v1`` only, and the ASGI middleware named by
``--middleware`` runs before every request.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# How long a stand-in's /health answers 503 before it is ready (``--standin-load-seconds``).
LOAD_SECONDS = 0.2


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="standin", add_help=True)
    parser.add_argument("mode", nargs="?", choices=["serve"], help="vLLM's subcommand")
    parser.add_argument("path", nargs="?", help="vLLM's model path")
    parser.add_argument("-m", "--model", "--model-path", dest="model_path")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("-a", "--alias", "--served-model-name", dest="alias")
    parser.add_argument("--api-key")
    parser.add_argument("--config", help="SGLang's config file: `option: value` lines")
    parser.add_argument("--standin-load-seconds", type=float, default=LOAD_SECONDS)
    parser.add_argument("--standin-hang", action="store_true")
    parser.add_argument("--standin-crash-after", type=float)
    parser.add_argument("--standin-oom", action="store_true")
    parser.add_argument("--standin-ignore-sigterm", action="store_true")
    parser.add_argument("--standin-chunks", type=int, default=16)
    parser.add_argument("--standin-chunk-delay", type=float, default=0.0)
    parser.add_argument("--standin-prefill-ms", type=float, default=0.0)
    parser.add_argument("--standin-sleep-seconds", type=float, default=0.05)
    parser.add_argument("--standin-wake-oom", action="store_true")
    parser.add_argument("--enable-sleep-mode", action="store_true")
    parser.add_argument("--middleware", action="append", default=[])
    known, _ = parser.parse_known_args(argv)  # the backends' own options are accepted as they are
    known.model_path = known.model_path or known.path
    if not known.model_path:
        parser.error("no model path given (-m, --model-path, or serve PATH)")
    known.api_key = known.api_key or _key_from_config(known.config) or _key_from_env(known.mode)
    return known


def _key_from_env(mode: str | None) -> str | None:
    return os.environ.get("VLLM_API_KEY" if mode == "serve" else "LLAMA_API_KEY") or None


def _key_from_config(path: str | None) -> str | None:
    if not path:
        return None
    for line in Path(path).read_text().splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "api-key":
            return value.strip()
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # like the real servers: each token goes out at once
    options: argparse.Namespace
    ready_at: float
    crash_armed = False
    sleeping = False

    def log_message(self, format: str, *args: Any) -> None:
        sys.stdout.write(f"{self.address_string()} {format % args}\n")

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.options.middleware and not middleware_passes(self):  # as vLLM's ASGI app runs them
            return
        if self.path == "/is_sleeping" and dev_mode(self.options):
            self._json(200, {"is_sleeping": Handler.sleeping})
        elif self.path == "/health":
            loading = self.options.standin_hang or time.monotonic() < self.ready_at
            if loading:
                self._json(
                    503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
                )
            else:
                self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.options.alias, "object": "model"}]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found_error"}})

    def _authorized(self) -> bool:
        """Like the real servers: with a key set, a request without it gets 401 (vLLM's key
        guards the paths under ``/v1`` only)."""
        key = self.options.api_key
        if self.options.mode == "serve" and not self.path.startswith("/v1"):
            return True
        if not key or self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self._json(
            401, {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
        )
        return False

    def do_POST(self) -> None:
        if self.options.middleware and not middleware_passes(self):  # as vLLM's ASGI app runs them
            return
        length = int(self.headers.get("Content-Length") or 0)
        if not self._authorized():
            self.rfile.read(length)
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self._json(400, {"error": {"message": "invalid JSON", "type": "invalid_request_error"}})
            return
        if self.path.split("?")[0] in {"/sleep", "/wake_up"} and dev_mode(self.options):
            self._sleep_or_wake()
        elif Handler.sleeping and self.path.startswith("/v1/"):
            self._json(503, {"error": {"message": "The engine is sleeping", "type": "unavailable_error"}})
        elif self.path == "/v1/embeddings":
            inputs = body.get("input", "")
            count = len(inputs) if isinstance(inputs, list) else 1
            data = [{"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]} for i in range(count)]
            self._json(
                200,
                {
                    "object": "list",
                    "data": data,
                    "model": self.options.alias,
                    "usage": {"prompt_tokens": count, "total_tokens": count},
                },
            )
        elif self.path in {"/v1/chat/completions", "/v1/completions"}:
            self._complete(body, chat=self.path == "/v1/chat/completions")
        else:
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found_error"}})

    def _sleep_or_wake(self) -> None:
        """vLLM's sleep mode: weights to host RAM and back, each taking a while; a wake fails
        when the GPU's memory was taken meanwhile (``--standin-wake-oom``)."""
        if not self.options.enable_sleep_mode:
            message = "Sleep mode is not enabled (--enable-sleep-mode)"
            self._json(500, {"error": {"message": message, "type": "InternalServerError"}})
            return
        time.sleep(self.options.standin_sleep_seconds)
        if self.path.startswith("/wake_up"):
            if self.options.standin_wake_oom:
                message = "CUDA out of memory. Tried to allocate 14.00 GiB while waking the engine"
                print(f"torch.OutOfMemoryError: {message}", flush=True)
                self._json(500, {"error": {"message": message, "type": "InternalServerError"}})
                return
            Handler.sleeping = False
            print("standin: woke up", flush=True)
        else:
            Handler.sleeping = True
            print(f"standin: asleep ({self.path})", flush=True)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _complete(self, body: dict[str, Any], *, chat: bool) -> None:
        if self.options.standin_crash_after is not None and not Handler.crash_armed:
            Handler.crash_armed = True
            threading.Thread(target=_crash, args=(self.options.standin_crash_after,), daemon=True).start()
        print(f"standin: generating for {self.path}", flush=True)
        if not self._prefill():
            return
        n = self.options.standin_chunks
        ident = f"cmpl-{uuid.uuid4().hex[:12]}"
        kind = "chat.completion" if chat else "text_completion"
        usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
        if not body.get("stream"):
            text = " ".join(f"t{i}" for i in range(n))
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            self._json(
                200,
                {
                    "id": ident,
                    "object": kind,
                    "model": self.options.alias,
                    "choices": [choice],
                    "usage": usage,
                },
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        for i in range(n):
            piece = f"t{i} "
            delta: dict[str, Any] = {"index": 0, "finish_reason": "stop" if i == n - 1 else None}
            delta.update({"delta": {"content": piece}} if chat else {"text": piece})
            try:
                self._event(
                    {"id": ident, "object": f"{kind}.chunk", "model": self.options.alias, "choices": [delta]}
                )
            except (BrokenPipeError, ConnectionResetError):
                # Like the real servers: a client that hangs up cancels the generation.
                print(f"standin: client went away after {i} of {n} chunks; generation cancelled", flush=True)
                self.close_connection = True
                return
            if self.options.standin_chunk_delay:
                time.sleep(self.options.standin_chunk_delay / 1000)
        if include_usage:
            self._event(
                {
                    "id": ident,
                    "object": f"{kind}.chunk",
                    "model": self.options.alias,
                    "choices": [],
                    "usage": usage,
                }
            )
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _prefill(self) -> bool:
        """Read the prompt for --standin-prefill-ms; False when the client hung up meanwhile
        (like the real servers, which abort a request whose client is gone)."""
        deadline = time.monotonic() + self.options.standin_prefill_ms / 1000
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([self.connection], [], [], min(left, 0.05))
            if readable and self.connection.recv(1, socket.MSG_PEEK) == b"":
                print("standin: client went away before the first token; generation cancelled", flush=True)
                self.close_connection = True
                return False
            if readable:
                time.sleep(min(left, 0.05))  # the client's next request is waiting: keep thinking
        return True

    def _event(self, payload: dict[str, Any]) -> None:
        self._chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def dev_mode(options: argparse.Namespace) -> bool:
    """vLLM serves its development endpoints (sleep mode's among them) only when told to."""
    return options.mode == "serve" and os.environ.get("VLLM_SERVER_DEV_MODE") == "1"


def middleware_passes(handler: Handler) -> bool:
    """Run the request's scope through the ``--middleware`` chain (ASGI classes, as vLLM adds
    them); False when one of them answered it (its answer is sent)."""
    import asyncio
    import importlib

    reached = False

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal reached
        reached = True

    app: Any = inner
    for name in reversed(handler.options.middleware):
        module, _, attribute = name.rpartition(".")
        app = getattr(importlib.import_module(module), attribute)(app)
    answer: dict[str, Any] = {"status": 500, "headers": [], "body": b""}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer.update(status=message["status"], headers=message.get("headers", []))
        else:
            answer["body"] += message.get("body", b"")

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    path = handler.path.split("?")[0]
    headers = [(k.lower().encode(), v.encode()) for k, v in handler.headers.items()]
    scope = {"type": "http", "method": handler.command, "path": path, "headers": headers}
    asyncio.run(app(scope, receive, send))
    if reached:
        return True
    handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
    handler.send_response(answer["status"])
    for key, value in answer["headers"]:
        handler.send_header(key.decode(), value.decode())
    handler.end_headers()
    handler.wfile.write(answer["body"])
    return False


def _crash(after: float) -> None:
    time.sleep(after)
    print("standin: fatal error: segmentation fault (simulated)", flush=True)
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    print(f"standin: loading {options.model_path} as {options.alias!r}", flush=True)
    if not Path(options.model_path).exists():
        print(f"error: model path {options.model_path} does not exist", flush=True)
        return 1
    if options.standin_oom:
        time.sleep(0.1)
        print(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total "
            "capacity of 23.64 GiB of which 1.02 GiB is free.",
            flush=True,
        )
        return 1
    if options.standin_ignore_sigterm:
        signal.signal(signal.SIGTERM, lambda *_: print("standin: ignoring SIGTERM", flush=True))
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    Handler.options = options
    Handler.ready_at = time.monotonic() + options.standin_load_seconds
    server = ThreadingHTTPServer((options.host, options.port), Handler)
    server.daemon_threads = True
    print(f"standin: listening on {options.host}:{options.port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.05)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
