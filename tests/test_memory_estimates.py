"""GPU memory estimates on model files written at test time, so every byte is known."""

from __future__ import annotations

import json

import pytest

from channels_app.placement.memory import (
    DEFAULT_OVERHEAD_BYTES,
    ShapeUnreadable,
    estimate_for,
    preset_memory_args,
    read_gguf_shape,
)

# The tiny model: 2 blocks, 64 wide, 4 heads (4 KV heads, head size 16), 259 tokens, F32.
BLOCK = 64 * 4 + 4 * 64 * 64 * 4 + 64 * 4 + 3 * 128 * 64 * 4  # norms, q k v o, ffn gate up down
OTHER = 259 * 64 * 4 * 2 + 64 * 4  # token embeddings, output, output norm
KV_PER_TOKEN_LAYER_F16 = 4 * (16 * 2 + 16 * 2)


def test_gguf_shape_is_read_from_the_metadata(tiny_gguf):
    shape = read_gguf_shape(tiny_gguf)
    assert (shape.n_layers, shape.n_embd, shape.n_head, shape.n_head_kv, shape.context_length) == (
        2,
        64,
        4,
        4,
        512,
    )
    assert (shape.layer_bytes, shape.other_bytes) == (2 * BLOCK, OTHER)


@pytest.mark.parametrize(
    ("args", "weights", "kv_cache", "context", "layers"),
    [
        ([], 2 * BLOCK + OTHER, 2 * 512 * KV_PER_TOKEN_LAYER_F16, 512, 2),
        (["-c", "256"], 2 * BLOCK + OTHER, 2 * 256 * KV_PER_TOKEN_LAYER_F16, 256, 2),
        (["-c", "0"], 2 * BLOCK + OTHER, 2 * 512 * KV_PER_TOKEN_LAYER_F16, 512, 2),
        (["-ngl", "1", "-c", "256"], BLOCK, 1 * 256 * KV_PER_TOKEN_LAYER_F16, 256, 1),
        (["-ngl", "2"], 2 * BLOCK, 2 * 512 * KV_PER_TOKEN_LAYER_F16, 512, 2),  # output stays on the CPU
        (["-ngl", "99"], 2 * BLOCK + OTHER, 2 * 512 * KV_PER_TOKEN_LAYER_F16, 512, 2),
        (["-ngl", "0"], 0, 0, 512, 0),
        (
            ["--ctx-size=128", "-ctk", "q8_0"],
            2 * BLOCK + OTHER,
            int(2 * 128 * 4 * (16 * 34 / 32 + 16 * 2)),
            128,
            2,
        ),
    ],
)
def test_gguf_estimate(tiny_gguf, args, weights, kv_cache, context, layers):
    estimate = estimate_for(backend="llama.cpp", path=str(tiny_gguf), args=args)
    assert (estimate.weights, estimate.kv_cache, estimate.context, estimate.gpu_layers) == (
        weights,
        kv_cache,
        context,
        layers,
    )
    assert estimate.total == weights + kv_cache + DEFAULT_OVERHEAD_BYTES


def test_hf_folder_estimate(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 32,
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "max_position_embeddings": 32768,
                "torch_dtype": "bfloat16",
            }
        )
    )
    for i, size in enumerate((5_000_000, 3_000_000)):
        (tmp_path / f"model-{i}.safetensors").write_bytes(b"\0" * size)
    estimate = estimate_for(backend="vllm", path=str(tmp_path), args=["--max-model-len", "8192"])
    kv = 2 * 32 * 8192 * 8 * 128 * 2
    assert (estimate.weights, estimate.kv_cache, estimate.context) == (8_000_000, kv, 8192)
    assert estimate.total == int((8_000_000 + kv + DEFAULT_OVERHEAD_BYTES) / 0.9)
    half = estimate_for(backend="vllm", path=str(tmp_path), args=["--gpu-memory-utilization", "0.5"])
    assert half.context == 32768 and half.total == int((8_000_000 + 4 * kv + DEFAULT_OVERHEAD_BYTES) / 0.5)


def test_unreadable_models_are_named(tmp_path):
    with pytest.raises(ShapeUnreadable, match=r"config\.json"):
        estimate_for(backend="vllm", path=str(tmp_path), args=[])
    bogus = tmp_path / "x.gguf"
    bogus.write_bytes(b"not a gguf file at all")
    with pytest.raises(ShapeUnreadable, match=r"x\.gguf"):
        estimate_for(backend="llama.cpp", path=str(bogus), args=[])


def test_preset_memory_args_last_one_wins():
    parsed = preset_memory_args(["-c", "4096", "--ctx-size=8192", "-ngl", "40", "--cache-type-v", "Q4_0"])
    assert (parsed.context, parsed.gpu_layers, parsed.cache_type_k, parsed.cache_type_v) == (
        8192,
        40,
        "f16",
        "q4_0",
    )


@pytest.mark.django_db
def test_hint_when_the_estimate_exceeds_the_channel(tiny_gguf, ana_api):
    from datetime import timedelta

    from django.utils import timezone

    from tests import factories
    from tests.factories import iso

    model = factories.llm("tiny", size=tiny_gguf.stat().st_size)
    model.path = str(tiny_gguf)
    model.save()
    preset = factories.preset(model, "long", "-c 512")
    channel = factories.channel("small", on=factories.node("n", memory=400 * 2**20))
    start = timezone.now() + timedelta(hours=1)
    answer = ana_api.get(
        "/api/reservations/hints",
        {
            "channel": channel.pk,
            "start": iso(start),
            "end": iso(start + timedelta(hours=1)),
            "model": model.pk,
            "preset": preset.pk,
        },
    )
    codes = {w["code"]: w for w in answer.data["warnings"]}
    assert "exceeds_vram" not in codes  # the file itself is tiny
    warning = codes["estimated_memory_exceeds_vram"]
    assert warning["memory"]["kv_cache"] == 2 * 512 * KV_PER_TOKEN_LAYER_F16
    assert "exceeds the channel's 0.4 GiB" in warning["message"]
    presets = ana_api.get("/api/presets/", {"model": "tiny"}).data
    assert presets[0]["memory"]["total"] == warning["memory"]["total"]
