"""``GET /v1/models`` and ``/v1/models/{id}``: what the caller may use now, with what each
process says of its model (llama-server's ``meta`` and context size)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from django.utils import timezone

from gateway.admit.refusals import (
    error_body,
    respond,
)
from gateway.admit.snapshot import Snapshot
from gateway.rules import key_scope
from gateway.rules.access import ChannelView, models_for, with_switching
from gateway.rules.callers import Caller
from gateway.types import Send
from gateway.wire.counters import Counters
from gateway.wire.upstream import Upstreams
from slotserve_base.vocabulary import ErrorCode


class ModelList:
    """``GET /v1/models`` and ``/v1/models/{id}``, with what each run's process says of its model,
    kept here per run (the process and its secret)."""

    # Runs whose answers are kept at most; then the cache starts over.
    MOST_KEPT = 1024

    def __init__(self, counters: Counters, upstreams: Upstreams) -> None:
        self.counters = counters
        self.upstreams = upstreams
        self.meta: dict[tuple[str, str], dict[str, Any]] = {}

    async def answer(
        self, send: Send, snapshot: Snapshot, caller: Caller, pinned: str | None, only: str | None = None
    ) -> None:
        """One entry per model the caller may use now, the channels serving it listed inside;
        then those a request of theirs may load on demand (``"on_demand": true``, no channel)."""
        reachable = key_scope.reachable(caller, snapshot.channels)
        channels = [c for c in reachable if pinned is None or c.name == pinned]
        switching = await self.counters.switching(c.id for c in channels)
        views = [with_switching(c, c.id in switching) for c in channels]
        pairs = models_for(caller_id=caller.user_id, channels=views, now=timezone.now())
        if caller.models_allowed is not None:  # the key's own scope
            pairs = [(model, name) for model, name in pairs if model in caller.models_allowed]
        serving: dict[str, list[str]] = {}
        for model, name in pairs:
            serving.setdefault(model, []).append(name)
        since = {c.model: c.since for c in views if c.model is not None}
        aliases: dict[str, list[str]] = {}
        for alias, model in sorted(snapshot.aliases.items()):
            aliases.setdefault(model, []).append(alias)
        first = {}
        for view in views:
            if view.model in serving and view.model not in first and view.upstream:
                first[view.model] = view
        metas = await asyncio.gather(*(self.model_meta(view) for view in first.values()))
        meta = dict(zip(first, metas, strict=True))
        data = [
            {
                "id": model,
                "object": "model",
                "created": int(since[model].timestamp()),
                "owned_by": "slotserve",
                "channels": names,
                "aliases": aliases.get(model, []),
                **({"meta": meta[model]} if meta.get(model) else {}),
            }
            for model, names in serving.items()
        ]
        if pinned is None and caller.loads_on_demand:
            # What a request may load on a free channel (docs/scheduling.md, "Loaded on demand").
            # Not a model some channel runs or heads for: a request for it is answered there.
            loadable = snapshot.on_demand_models - {m for c in views for m in (c.model, c.targets_model) if m}
            if caller.models_allowed is not None:
                loadable &= caller.models_allowed
            data += [
                {
                    "id": model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "slotserve",
                    "channels": [],
                    "aliases": aliases.get(model, []),
                    "on_demand": True,
                }
                for model in sorted(loadable)
            ]
        if only is not None:
            only = snapshot.aliases.get(only, only)
        if only is None:
            await respond(send, 200, json.dumps({"object": "list", "data": data}).encode())
            return
        entry = next((d for d in data if d["id"] == only), None)
        if entry is None:
            message = f"model {only!r} is not served to you now" + (
                f"; served now: {', '.join(serving)}" if serving else ""
            )
            await respond(send, 404, error_body(404, ErrorCode.MODEL_NOT_LOADED, message))
            return
        await respond(send, 200, json.dumps(entry).encode())

    async def model_meta(self, channel: ChannelView) -> dict[str, Any]:
        """llama-server's ``meta`` of its model and its context size (``n_ctx``), asked of the
        process once per run; {} where the backend has none or does not answer within a second."""
        assert channel.upstream is not None
        found = self.meta.get((channel.upstream, channel.upstream_key))
        if found is not None:
            return found
        meta: dict[str, Any] = {}
        upstream = self.upstreams.upstream_for(channel.upstream)
        headers = [(b"authorization", f"Bearer {channel.upstream_key}".encode())]
        try:
            async with asyncio.timeout(1.0):
                for path in ("/v1/models", "/props"):
                    response = await upstream.handle_async_request(
                        httpx.Request("GET", upstream.url(path), headers=headers)
                    )
                    content = await response.aread()
                    await response.aclose()
                    if response.status_code != 200:
                        continue
                    answer = json.loads(content)
                    if path == "/v1/models":
                        entries = answer.get("data") or []
                        if entries and isinstance(entries[0].get("meta"), dict):
                            meta.update(entries[0]["meta"])
                    else:
                        n_ctx = (answer.get("default_generation_settings") or {}).get("n_ctx")
                        if isinstance(n_ctx, int):
                            meta["n_ctx"] = n_ctx
        except (TimeoutError, httpx.HTTPError, ValueError, AttributeError):
            return meta  # not kept: asked again next time
        if len(self.meta) > self.MOST_KEPT:
            self.meta.clear()
        self.meta[(channel.upstream, channel.upstream_key)] = meta
        return meta
