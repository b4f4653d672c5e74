"""Finding model files on a node: GGUF files, and HF folders (config.json + safetensors)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.db import transaction

from channels_app.backends import Backend
from channels_app.models import LLMModel, ModelFile, Node

MAX_DEPTH = 3


@dataclass(frozen=True)
class FoundFile:
    path: str
    backend: str
    size_bytes: int
    modified: datetime


def scan(folders: Iterable[str]) -> list[FoundFile]:
    """Every ``*.gguf`` file and every folder holding ``config.json`` and ``*.safetensors``."""
    found: dict[str, FoundFile] = {}
    for folder in folders:
        root = Path(folder)
        if not root.is_dir():
            continue
        for path in _walk(root, MAX_DEPTH):
            if path.is_file() and path.suffix == ".gguf":
                stat = path.stat()
                found[str(path)] = FoundFile(
                    str(path), Backend.LLAMA_CPP, stat.st_size, datetime.fromtimestamp(stat.st_mtime, UTC)
                )
            elif path.is_dir() and (path / "config.json").is_file():
                weights = list(path.glob("*.safetensors"))
                if weights:
                    stats = [p.stat() for p in weights]
                    found[str(path)] = FoundFile(
                        str(path),
                        Backend.VLLM,
                        sum(s.st_size for s in stats),
                        datetime.fromtimestamp(max(s.st_mtime for s in stats), UTC),
                    )
    return sorted(found.values(), key=lambda f: f.path)


def _walk(root: Path, depth: int) -> Iterable[Path]:
    try:
        children = list(root.iterdir())
    except OSError:
        return
    for child in children:
        yield child
        if depth > 1 and child.is_dir() and not child.is_symlink():
            yield from _walk(child, depth - 1)


def report(*, node: Node, files: list[FoundFile], now: datetime) -> None:
    """Store what the node has, and which registered models' files are on it."""
    with transaction.atomic():
        for f in files:
            ModelFile.objects.update_or_create(
                node=node,
                path=f.path,
                defaults={
                    "backend": f.backend,
                    "size_bytes": f.size_bytes,
                    "modified": f.modified,
                    "seen_at": now,
                },
            )
        ModelFile.objects.filter(node=node).exclude(path__in=[f.path for f in files]).delete()
        present = {f.path for f in files}
        for model in LLMModel.objects.filter(path__in=present):
            model.nodes.add(node)
        for model in node.models.exclude(path__in=present):
            model.nodes.remove(node)
