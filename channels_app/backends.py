"""Inference backends and the command-line arguments SlotServe owns (docs/scheduling.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import models


class Backend(models.TextChoices):
    LLAMA_CPP = "llama.cpp", "llama.cpp (llama-server)"
    VLLM = "vllm", "vLLM"
    SGLANG = "sglang", "SGLang"


@dataclass(frozen=True)
class OwnedOption:
    """An option SlotServe sets itself (or keeps off); ``many`` options take several values,
    a ``flag`` none."""

    names: frozenset[str]
    many: bool = False
    flag: bool = False


# The run's own secret (docs/security.md): a preset may neither replace it nor add a key it knows.
_API_KEY = OwnedOption(frozenset({"--api-key"}))
# A config file can set anything the command line can, the owned options included.
_CONFIG = OwnedOption(frozenset({"--config"}))

# Removed from presets so that a wrong value can never break routing or access.
OWNED_OPTIONS: dict[Backend, tuple[OwnedOption, ...]] = {
    Backend.LLAMA_CPP: (
        OwnedOption(frozenset({"-m", "--model"})),
        OwnedOption(frozenset({"--host"})),
        OwnedOption(frozenset({"--port"})),
        OwnedOption(frozenset({"-a", "--alias"})),
        _API_KEY,
        OwnedOption(frozenset({"--api-key-file"})),
        # llama-server's admin surface, which would answer any caller of the channel: slot
        # files written under names of their choice (and another user's slot state restored),
        # settings changed (POST /props), files of the node served (--path), routes moved
        # (docs/security.md).
        OwnedOption(frozenset({"--slot-save-path"})),
        OwnedOption(frozenset({"--props"}), flag=True),
        OwnedOption(frozenset({"--path"})),
        OwnedOption(frozenset({"--api-prefix"})),
        # The web UI's CORS proxy fetches any address the node reaches, and server-side tools
        # run on the node (docs/security.md): never through a preset.
        OwnedOption(frozenset({"--ui-mcp-proxy", "--webui-mcp-proxy"}), flag=True),
        OwnedOption(frozenset({"-ag", "--agent"}), flag=True),
        OwnedOption(frozenset({"--tools"})),
        OwnedOption(frozenset({"--tools-runtime"})),
        OwnedOption(frozenset({"--mcp-servers-config"})),
        OwnedOption(frozenset({"--mcp-servers-json"})),
    ),
    Backend.VLLM: (
        OwnedOption(frozenset({"--model"})),
        OwnedOption(frozenset({"--host"})),
        OwnedOption(frozenset({"--port"})),
        OwnedOption(frozenset({"--served-model-name"}), many=True),
        _API_KEY,
        _CONFIG,
        # The ASGI middleware vLLM runs (code of the preset's choosing inside the process):
        # SlotServe's guard is the only one (node_worker.sleep_mode).
        OwnedOption(frozenset({"--middleware"}), many=True),
    ),
    Backend.SGLANG: (
        OwnedOption(frozenset({"--model-path", "--model"})),
        OwnedOption(frozenset({"--host"})),
        OwnedOption(frozenset({"--port"})),
        OwnedOption(frozenset({"--served-model-name"}), many=True),
        _API_KEY,
        OwnedOption(frozenset({"--admin-api-key"})),
        _CONFIG,
    ),
}

# How each backend is given the run's secret without putting it on the command line, where
# every user of the node could read it (/proc/<pid>/cmdline): an environment variable the
# program reads, or (SGLang, which reads none) a config file only the node worker can read.
API_KEY_ENV: dict[Backend, str | None] = {
    Backend.LLAMA_CPP: "LLAMA_API_KEY",
    Backend.VLLM: "VLLM_API_KEY",
    Backend.SGLANG: None,
}


def _is_option(token: str) -> bool:
    # "-1" is a value (e.g. "-ngl -1"), not an option.
    return token.startswith("-") and not token.lstrip("-").replace(".", "", 1).isdigit()


def _owned_option(name: str, by_name: dict[str, OwnedOption]) -> OwnedOption | None:
    """The owned option ``name`` names, exactly or as an abbreviation.

    vLLM and SGLang parse with argparse, which takes any unique prefix of a long
    option (``--hos 0.0.0.0`` is ``--host 0.0.0.0``): every prefix of an owned long
    option is owned too, for every backend, whatever the program would make of it.
    """
    exact = by_name.get(name)
    if exact is not None or not name.startswith("--") or len(name) < 3:
        return exact
    return next((option for owned, option in by_name.items() if owned.startswith(name)), None)


def effective_args(backend: Backend, args: Sequence[str]) -> list[str]:
    """``args`` without the options SlotServe owns for ``backend``.

    Both ``--opt value`` and ``--opt=value`` are removed, in short, long and
    abbreviated forms; an owned option that takes several values loses all of them.
    """
    owned = OWNED_OPTIONS[backend]
    by_name = {name: option for option in owned for name in option.names}
    result: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        name, has_value, _ = token.partition("=")
        option = _owned_option(name, by_name) if _is_option(token) else None
        if option is None:
            result.append(token)
            i += 1
            continue
        i += 1
        if has_value or option.flag:
            continue
        if i < len(args) and not _is_option(args[i]):
            i += 1
            while option.many and i < len(args) and not _is_option(args[i]):
                i += 1
    return result


def option_value(args: Sequence[str], names: set[str]) -> str | None:
    """The value of the last of ``names`` in ``args`` (``--opt value`` or ``--opt=value``), as on a
    command line the last one given wins; None when none is given."""
    found = None
    for i, token in enumerate(args):
        name, has_value, value = token.partition("=")
        if name in names:
            if has_value:
                found = value
            elif i + 1 < len(args):
                found = args[i + 1]
    return found


# Where each backend's preset names a draft model for speculative decoding (docs/scheduling.md
# "Placement": its file counts in the local-path filter and, at half weight, in locality).
DRAFT_OPTIONS: dict[str, set[str]] = {
    Backend.LLAMA_CPP: {"-md", "--model-draft"},
    Backend.SGLANG: {"--speculative-draft-model-path"},
}


def draft_model_path(backend: str, args: Sequence[str]) -> str | None:
    """The draft model a preset names, or None: llama.cpp's ``-md``/``--model-draft``, SGLang's
    ``--speculative-draft-model-path``, the ``model`` of vLLM's ``--speculative-config`` JSON
    (an n-gram or other method without a model has no file)."""
    if backend == Backend.VLLM:
        config = option_value(args, {"--speculative-config"})
        try:
            parsed = json.loads(config) if config else None
        except ValueError:
            return None
        model = parsed.get("model") if isinstance(parsed, dict) else None
        return model if isinstance(model, str) and model else None
    names = DRAFT_OPTIONS.get(backend)
    return option_value(args, names) if names else None


# How many requests each backend's process serves at once (its *places*, docs/gateway.md "Fair
# sharing under contention"): the option that sets it, and the program's default where a preset
# gives none. llama-server's own answer (``/props`` ``total_slots``) is read when it is ready;
# its default (-np -1: "auto") is known only then.
PLACES_OPTIONS: dict[str, tuple[set[str], int | None]] = {
    Backend.LLAMA_CPP: ({"-np", "--parallel"}, None),
    Backend.VLLM: ({"--max-num-seqs"}, 256),
    Backend.SGLANG: ({"--max-running-requests"}, None),
}


def places_asked(backend: str, args: Sequence[str]) -> int | None:
    """The requests a process started with ``args`` serves at once, as far as its command line
    tells: the option's value, else the backend's default; None when only the process knows."""
    names, default = PLACES_OPTIONS.get(backend, (set(), None))
    value = option_value(args, names)
    if value is not None:
        try:
            places = int(value)
        except ValueError:
            return default
        return places if places > 0 else default
    return default
