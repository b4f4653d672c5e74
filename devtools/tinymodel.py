"""A tiny llama-architecture GGUF model, written on demand.

Two blocks, 64 wide, a byte-level llama tokenizer (``<unk>``, ``<s>``,
``</s>`` and the 256 ``<0xNN>`` byte tokens) and random F32 weights:
``llama-server`` loads it in well under a second on a CPU and streams
tokens from it (nonsense, but real tokens). Used by the tests and the demo.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

N_EMBD = 64
N_BLOCKS = 2
N_HEAD = 4
N_HEAD_KV = 4
N_FF = 128
CONTEXT = 512
SPECIAL = ["<unk>", "<s>", "</s>"]
VOCAB = SPECIAL + [f"<0x{b:02X}>" for b in range(256)]
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_BYTE = 1, 2, 3, 6


def write_tiny_llama(
    path: str | Path, *, seed: int = 0, width: int = N_EMBD, blocks: int = N_BLOCKS, ff: int = N_FF
) -> Path:
    """Write the model to ``path`` (about 0.5 MB) and return the path. Wider and deeper ones
    (``width``, ``blocks``, ``ff``) make a file of a real model's size: width 1024, ff 4096 and
    24 blocks give 1.6 GB (the switch benchmark's cold case)."""
    import gguf

    # The writer's lines ("Writing the following files: …") are not news to whoever starts the demo.
    logging.getLogger("gguf").setLevel(logging.WARNING)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer = gguf.GGUFWriter(str(target), "llama")
    writer.add_name("slotserve-tiny-llama")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(width)
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(width // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)  # all F32
    writer.add_tokenizer_model("llama")
    writer.add_token_list(VOCAB)
    writer.add_token_scores([0.0] * len(VOCAB))
    writer.add_token_types([TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * 256)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    vocab = len(VOCAB)
    writer.add_tensor("token_embd.weight", weights(vocab, width))
    writer.add_tensor("output_norm.weight", np.ones(width, dtype=np.float32))
    writer.add_tensor("output.weight", weights(vocab, width))
    kv = N_HEAD_KV * (width // N_HEAD)
    for block in range(blocks):
        prefix = f"blk.{block}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(width, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_q.weight", weights(width, width))
        writer.add_tensor(f"{prefix}.attn_k.weight", weights(kv, width))
        writer.add_tensor(f"{prefix}.attn_v.weight", weights(kv, width))
        writer.add_tensor(f"{prefix}.attn_output.weight", weights(width, width))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(width, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", weights(ff, width))
        writer.add_tensor(f"{prefix}.ffn_up.weight", weights(ff, width))
        writer.add_tensor(f"{prefix}.ffn_down.weight", weights(width, ff))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


if __name__ == "__main__":  # python -m devtools.tinymodel PATH [SEED]: write the model there
    import sys

    print(write_tiny_llama(sys.argv[1], seed=int(sys.argv[2]) if len(sys.argv) > 2 else 0))
