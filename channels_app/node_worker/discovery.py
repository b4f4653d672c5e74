"""Finding model files on a node: GGUF files, and HF folders (config.json + safetensors)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.db import transaction

from channels_app.backends import Backend
from channels_app.models import LLMModel, ModelFile, Node
from channels_app.placement.memory import ShapeUnreadable, read_shape

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


def shape_of(f: FoundFile) -> tuple[dict[str, Any] | None, str]:
    """What memory estimates need of the file, read here on the node; or why it cannot be read."""
    try:
        return read_shape(backend=f.backend, path=f.path), ""
    except ShapeUnreadable as exc:
        return None, str(exc)


def report(*, node: Node, files: list[FoundFile], now: datetime) -> None:
    """Store what the node has, with what estimates need of each file (read once per change of
    the file), and which registered models' files are on it; a model registered without a size
    gets its file's."""
    known = {m.path: m for m in ModelFile.objects.filter(node=node)}
    shapes = {}
    for f in files:
        seen = known.get(f.path)
        if (
            seen is None
            or (seen.size_bytes, seen.modified) != (f.size_bytes, f.modified)
            or not (seen.shape or seen.shape_error)
        ):
            shapes[f.path] = shape_of(f)  # outside the transaction: reading a file takes time
    with transaction.atomic():
        for f in files:
            defaults: dict[str, Any] = {
                "backend": f.backend,
                "size_bytes": f.size_bytes,
                "modified": f.modified,
                "seen_at": now,
            }
            if f.path in shapes:
                defaults["shape"], defaults["shape_error"] = shapes[f.path]
            ModelFile.objects.update_or_create(node=node, path=f.path, defaults=defaults)
            LLMModel.objects.filter(path=f.path, size_bytes=0).update(size_bytes=f.size_bytes)
        ModelFile.objects.filter(node=node).exclude(path__in=[f.path for f in files]).delete()
        present = {f.path for f in files}
        for model in LLMModel.objects.filter(path__in=present):
            model.nodes.add(node)
        for model in node.models.exclude(path__in=present):
            model.nodes.remove(node)
