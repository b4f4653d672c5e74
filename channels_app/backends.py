"""Inference backends and the command-line arguments SlotServe owns (SPEC §4)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import models


class Backend(models.TextChoices):
    LLAMA_CPP = "llama.cpp", "llama.cpp (llama-server)"
    VLLM = "vllm", "vLLM"
    SGLANG = "sglang", "SGLang"


@dataclass(frozen=True)
class OwnedOption:
    """An option SlotServe sets itself; ``many`` options take several values."""

    names: frozenset[str]
    many: bool = False


# Removed from presets so that a wrong value can never break routing.
OWNED_OPTIONS: dict[Backend, tuple[OwnedOption, ...]] = {
    Backend.LLAMA_CPP: (
        OwnedOption(frozenset({"-m", "--model"})),
        OwnedOption(frozenset({"--host"})),
        OwnedOption(frozenset({"--port"})),
        OwnedOption(frozenset({"-a", "--alias"})),
    ),
    Backend.VLLM: (
        OwnedOption(frozenset({"--model"})),
        OwnedOption(frozenset({"--host"})),
        OwnedOption(frozenset({"--port"})),
        OwnedOption(frozenset({"--served-model-name"}), many=True),
    ),
    Backend.SGLANG: (
        OwnedOption(frozenset({"--model-path", "--model"})),
        OwnedOption(frozenset({"--host"})),
        OwnedOption(frozenset({"--port"})),
        OwnedOption(frozenset({"--served-model-name"}), many=True),
    ),
}


def _is_option(token: str) -> bool:
    # "-1" is a value (e.g. "-ngl -1"), not an option.
    return token.startswith("-") and not token.lstrip("-").replace(".", "", 1).isdigit()


def effective_args(backend: Backend, args: Sequence[str]) -> list[str]:
    """``args`` without the options SlotServe owns for ``backend``.

    Both ``--opt value`` and ``--opt=value`` are removed, in short and long
    forms; an owned option that takes several values loses all of them.
    """
    owned = OWNED_OPTIONS[backend]
    by_name = {name: option for option in owned for name in option.names}
    result: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        name, has_value, _ = token.partition("=")
        option = by_name.get(name)
        if option is None:
            result.append(token)
            i += 1
            continue
        i += 1
        if has_value:
            continue
        if i < len(args) and not _is_option(args[i]):
            i += 1
            while option.many and i < len(args) and not _is_option(args[i]):
                i += 1
    return result
