"""How much GPU memory a model + preset needs (docs/scheduling.md "resource fit").

Pure estimates from a model's shape and the preset's arguments, and thin
readers for the shapes: a GGUF file's metadata (read with the ``gguf``
package) or an HF folder's ``config.json`` and safetensors files.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from channels_app.backends import option_value

MiB = 2**20
# CUDA context, compute buffers and the like, beyond weights and KV cache.
DEFAULT_OVERHEAD_BYTES = 512 * MiB
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default: it takes this share of the GPU

# Bytes per element of llama.cpp's KV cache types (block formats: block bytes / block size).
CACHE_TYPE_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "fp8": 1, "auto": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know of a model."""

    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    context_length: int
    layer_bytes: int  # the weights of all repeating layers together
    other_bytes: int  # embeddings, output, norms
    key_length: int | None = None
    value_length: int | None = None

    @property
    def head_dim_k(self) -> int:
        return self.key_length or self.n_embd // self.n_head

    @property
    def head_dim_v(self) -> int:
        return self.value_length or self.n_embd // self.n_head


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    kv_cache: int
    overhead: int
    total: int
    context: int
    gpu_layers: int
    ram: int = 0  # the weights left in the machine's memory (llama.cpp's layers beyond -ngl)

    def as_dict(self) -> dict[str, int]:
        return {
            "weights": self.weights,
            "kv_cache": self.kv_cache,
            "overhead": self.overhead,
            "total": self.total,
            "context": self.context,
            "gpu_layers": self.gpu_layers,
            "ram": self.ram,
        }


@dataclass(frozen=True)
class PresetMemoryArgs:
    gpu_layers: int | None = None
    context: int | None = None
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None


def preset_memory_args(args: Sequence[str]) -> PresetMemoryArgs:
    """The arguments that change memory use; the last one given wins, as on a command line."""

    def number(names: set[str]) -> int | None:
        raw = option_value(args, names)
        try:
            return int(raw) if raw is not None else None
        except ValueError:
            return None

    utilization = option_value(args, {"--gpu-memory-utilization", "--mem-fraction-static"})
    try:
        fraction = float(utilization) if utilization is not None else None
    except ValueError:
        fraction = None
    return PresetMemoryArgs(
        gpu_layers=number({"-ngl", "--gpu-layers", "--n-gpu-layers"}),
        context=number({"-c", "--ctx-size"}),
        cache_type_k=(option_value(args, {"-ctk", "--cache-type-k"}) or "f16").lower(),
        cache_type_v=(option_value(args, {"-ctv", "--cache-type-v"}) or "f16").lower(),
        max_model_len=number({"--max-model-len", "--context-length"}),
        gpu_memory_utilization=fraction,
    )


def estimate_gguf(
    shape: ModelShape, args: PresetMemoryArgs, *, overhead: int = DEFAULT_OVERHEAD_BYTES
) -> MemoryEstimate:
    """llama.cpp: the offloaded layers' weights + the KV cache of those layers + overhead; the
    layers not offloaded stay in the machine's memory (``ram``).

    ``-ngl`` missing means every layer on the GPU; ``-c`` missing or 0 means the
    model's trained context. The output layer goes with ``-ngl`` > layers.
    """
    layers = (
        shape.n_layers
        if args.gpu_layers is None or args.gpu_layers < 0
        else min(args.gpu_layers, shape.n_layers)
    )
    everything = args.gpu_layers is None or args.gpu_layers < 0 or args.gpu_layers > shape.n_layers
    weights = shape.layer_bytes * layers // max(shape.n_layers, 1) + (shape.other_bytes if everything else 0)
    context = args.context if args.context else shape.context_length
    k_bytes = CACHE_TYPE_BYTES.get(args.cache_type_k, 2.0)
    v_bytes = CACHE_TYPE_BYTES.get(args.cache_type_v, 2.0)
    per_token_layer = shape.n_head_kv * (shape.head_dim_k * k_bytes + shape.head_dim_v * v_bytes)
    kv_cache = int(layers * context * per_token_layer)
    ram = shape.layer_bytes + shape.other_bytes - weights
    return MemoryEstimate(weights, kv_cache, overhead, weights + kv_cache + overhead, context, layers, ram)


def estimate_hf(
    shape: ModelShape, args: PresetMemoryArgs, *, dtype_bytes: int = 2, overhead: int = DEFAULT_OVERHEAD_BYTES
) -> MemoryEstimate:
    """vLLM/SGLang: safetensors weights + KV cache for the context, over the memory share they claim.

    vLLM takes ``--gpu-memory-utilization`` (default 0.9) of the GPU, so the GPU
    must hold the need divided by that share.
    """
    context = args.max_model_len or shape.context_length
    kv_cache = 2 * shape.n_layers * context * shape.n_head_kv * (shape.n_embd // shape.n_head) * dtype_bytes
    weights = shape.layer_bytes + shape.other_bytes
    share = args.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
    need = weights + kv_cache + overhead
    total = int(need / share)
    return MemoryEstimate(weights, kv_cache, total - weights - kv_cache, total, context, shape.n_layers)


# --- Readers -------------------------------------------------------------------------


class ShapeUnreadable(Exception):
    """The model's file or folder cannot be read for an estimate here."""


def read_gguf_shape(path: str | Path) -> ModelShape:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    # A truncated or foreign file breaks the reader in several ways (an empty array, a short read).
    except (OSError, ValueError, IndexError, KeyError, TypeError) as exc:
        raise ShapeUnreadable(f"{path}: not a readable GGUF file ({exc})") from None

    def field(name: str, default: int | None = None) -> int | None:
        found = reader.fields.get(name)
        return int(found.contents()) if found is not None else default

    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise ShapeUnreadable(f"{path}: no general.architecture in the GGUF metadata")
    arch = str(arch_field.contents())
    n_layers = field(f"{arch}.block_count")
    n_embd = field(f"{arch}.embedding_length")
    n_head = field(f"{arch}.attention.head_count")
    if n_layers is None or n_embd is None or n_head is None:
        raise ShapeUnreadable(
            f"{path}: the {arch} metadata lacks block_count, embedding_length or head_count"
        )
    layer_bytes = sum(int(t.n_bytes) for t in reader.tensors if t.name.startswith("blk."))
    other_bytes = sum(int(t.n_bytes) for t in reader.tensors if not t.name.startswith("blk."))
    return ModelShape(
        n_layers=n_layers,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=field(f"{arch}.attention.head_count_kv", n_head) or n_head,
        context_length=field(f"{arch}.context_length", 4096) or 4096,
        layer_bytes=layer_bytes,
        other_bytes=other_bytes,
        key_length=field(f"{arch}.attention.key_length"),
        value_length=field(f"{arch}.attention.value_length"),
    )


def read_hf_shape(folder: str | Path) -> tuple[ModelShape, int]:
    """The shape from ``config.json`` and the weights from the safetensors files; and the dtype's bytes."""
    root = Path(folder)
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ShapeUnreadable(f"{root}/config.json: {exc}") from None
    config = config.get("text_config", config)
    try:
        n_layers = int(config["num_hidden_layers"])
        n_embd = int(config["hidden_size"])
        n_head = int(config["num_attention_heads"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ShapeUnreadable(f"{root}/config.json lacks {exc}") from None
    weights = sum(p.stat().st_size for p in root.glob("*.safetensors"))
    if weights == 0:
        raise ShapeUnreadable(f"{root}: no *.safetensors files")
    shape = ModelShape(
        n_layers=n_layers,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=int(config.get("num_key_value_heads") or n_head),
        context_length=int(config.get("max_position_embeddings") or 4096),
        layer_bytes=weights,
        other_bytes=0,
    )
    return shape, DTYPE_BYTES.get(str(config.get("torch_dtype", "auto")).lower(), 2)


def estimate_for(*, backend: str, path: str, args: Sequence[str]) -> MemoryEstimate:
    """The estimate for a model file or folder on this machine and a preset's effective arguments."""
    return estimate_from_shape(backend=backend, shape=read_shape(backend=backend, path=path), args=args)


def read_shape(*, backend: str, path: str) -> dict[str, Any]:
    """The shape of a model file or folder on this machine, as plain data a node can report."""
    if backend == "llama.cpp":
        return {**dataclasses.asdict(read_gguf_shape(path)), "dtype_bytes": 2}
    shape, dtype_bytes = read_hf_shape(path)
    return {**dataclasses.asdict(shape), "dtype_bytes": dtype_bytes}


def estimate_from_shape(*, backend: str, shape: dict[str, Any], args: Sequence[str]) -> MemoryEstimate:
    """The estimate from a shape read here or reported by the node that has the file."""
    fields = {f.name for f in dataclasses.fields(ModelShape)}
    try:
        model_shape = ModelShape(**{k: v for k, v in shape.items() if k in fields})
    except TypeError as exc:
        raise ShapeUnreadable(f"the reported shape is incomplete: {exc}") from None
    memory_args = preset_memory_args(args)
    if backend == "llama.cpp":
        return estimate_gguf(model_shape, memory_args)
    return estimate_hf(model_shape, memory_args, dtype_bytes=int(shape.get("dtype_bytes", 2)))
