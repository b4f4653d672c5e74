"""A whole answer made from a stream (docs/gateway.md, "Lending"): a borrowed request that did
not ask to stream goes to its process as a stream, so that the booker's request ending it frees
its place at once (a process notices a streamed client gone at its next token; llama-server
notices a waiting one only about every half second), and its caller gets the whole answer it
asked for, made here from the stream's events as the process would have made it.

OpenAI's Chat Completions and Completions: each choice's text, reasoning text, tool calls and
log probabilities joined in order, its finish reason, the usage, and llama-server's timings.
"""

from __future__ import annotations

from typing import Any

from gateway.rules.body import dumps, loads

# Where a borrowed request that did not ask to stream is sent as a stream and made whole again.
ASSEMBLED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/chat/completions"})


def may_assemble(path: str, body: dict[str, Any] | None) -> bool:
    """Whether a request can go upstream as a stream and come back whole."""
    return path in ASSEMBLED_PATHS and isinstance(body, dict) and body.get("stream") in (None, False)


class Assembly:
    """The events of a stream, made into the answer a request without ``stream`` gets."""

    def __init__(self) -> None:
        self.pending = b""
        self.head: dict[str, Any] = {}  # id, created, model, system_fingerprint
        self.chat = True
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: Any = None
        self.timings: Any = None

    def feed(self, chunk: bytes) -> None:
        data = self.pending + chunk
        events = data.replace(b"\r\n", b"\n").split(b"\n\n")
        self.pending = events.pop()
        for event in events:
            self._event(event)

    def _event(self, event: bytes) -> None:
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            text = line[5:].strip()
            if not text or text == b"[DONE]":
                continue
            try:
                payload = loads(text)
            except ValueError:
                continue
            if isinstance(payload, dict):
                self._payload(payload)

    def _payload(self, payload: dict[str, Any]) -> None:
        for name in ("id", "created", "model", "system_fingerprint"):
            if name in payload and name not in self.head:
                self.head[name] = payload[name]
        if payload.get("object") == "text_completion":
            self.chat = False
        if payload.get("usage") is not None:
            self.usage = payload["usage"]
        if payload.get("timings") is not None:
            self.timings = payload["timings"]
        for part in payload.get("choices") or []:
            if isinstance(part, dict):
                self._choice(part)

    def _choice(self, part: dict[str, Any]) -> None:
        index = part.get("index", 0)
        choice = self.choices.setdefault(
            index, {"index": index, "text": [], "reasoning": [], "tools": {}, "logprobs": [], "role": None}
        )
        if part.get("finish_reason") is not None:
            choice["finish_reason"] = part["finish_reason"]
        logprobs = part.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            choice["logprobs"].extend(logprobs["content"])
        if "text" in part:  # Completions
            self.chat = False
            if isinstance(part["text"], str):
                choice["text"].append(part["text"])
            return
        delta = part.get("delta")
        if not isinstance(delta, dict):
            return
        if delta.get("role"):
            choice["role"] = delta["role"]
        if isinstance(delta.get("content"), str):
            choice["text"].append(delta["content"])
        if isinstance(delta.get("reasoning_content"), str):
            choice["reasoning"].append(delta["reasoning_content"])
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            made = choice["tools"].setdefault(
                call.get("index", len(choice["tools"])), {"function": {"name": "", "arguments": ""}}
            )
            for name in ("id", "type"):
                if call.get(name):
                    made[name] = call[name]
            function = call.get("function")
            if isinstance(function, dict):
                made["function"]["name"] += function.get("name") or ""
                made["function"]["arguments"] += function.get("arguments") or ""

    def answer(self) -> bytes:
        """The whole answer, as JSON."""
        choices = []
        for index in sorted(self.choices):
            choice = self.choices[index]
            logprobs = {"content": choice["logprobs"]} if choice["logprobs"] else None
            made: dict[str, Any] = {"index": index, "finish_reason": choice.get("finish_reason")}
            if self.chat:
                message: dict[str, Any] = {
                    "role": choice["role"] or "assistant",
                    "content": "".join(choice["text"]) if choice["text"] or not choice["tools"] else None,
                }
                if choice["reasoning"]:
                    message["reasoning_content"] = "".join(choice["reasoning"])
                if choice["tools"]:
                    message["tool_calls"] = [
                        {"type": "function", **choice["tools"][i]} for i in sorted(choice["tools"])
                    ]
                made["message"] = message
            else:
                made["text"] = "".join(choice["text"])
            made["logprobs"] = logprobs
            choices.append(made)
        whole: dict[str, Any] = {
            **{k: v for k, v in self.head.items() if k in ("id",)},
            "object": "chat.completion" if self.chat else "text_completion",
            **{k: v for k, v in self.head.items() if k != "id"},
            "choices": choices,
        }
        if self.usage is not None:
            whole["usage"] = self.usage
        if self.timings is not None:
            whole["timings"] = self.timings
        return dumps(whole)
