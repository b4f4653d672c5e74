"""A failed run's reason in plain words, from its exit and its own output (docs/scheduling.md,
"Retries"): pure, used by the lifecycle (``channels_app.node_worker.lifecycle``)."""

from __future__ import annotations

import re

# Out-of-memory messages of llama.cpp, vLLM/PyTorch and SGLang.
OOM_PATTERNS = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaMalloc failed"
    r"|out of memory|failed to allocate .*buffer|unable to allocate .*buffer"
    r"|ggml_backend_cuda_buffer_type_alloc_buffer: allocating .* failed"
    r"|Not enough memory|insufficient memory",
    re.IGNORECASE,
)


# How the node worker's record of a launch that never ran begins (channels_app.node_worker.worker._launch).
LAUNCH_FAILED = "could not start"


# What to change after running out of GPU memory, in each backend's own options.
OOM_ADVICE = {
    "llama.cpp": "Lower -ngl (fewer layers on the GPU) or -c (a shorter context) in the preset, or book "
    "a channel with more GPU memory.",
    "vllm": "Lower --gpu-memory-utilization (the share of GPU memory vLLM takes) or --max-model-len "
    "(a shorter context) in the preset, or spread the model over more GPUs with "
    "--tensor-parallel-size on a channel that has them.",
    "sglang": "Lower --mem-fraction-static (the share of GPU memory SGLang keeps) or --context-length in "
    "the preset, or spread the model over more GPUs with --tp-size on a channel that has them.",
}


def explain_failure(
    *, exit_code: int | None, log_tail: str, timed_out_after: float | None = None, backend: str = ""
) -> str:
    """A failed run's reason in plain words, from its exit and its own output."""
    if OOM_PATTERNS.search(log_tail):
        advice = OOM_ADVICE.get(backend, OOM_ADVICE["llama.cpp"])
        return f"The GPU ran out of memory while loading the model. {advice}"
    if timed_out_after is not None:
        return f"The model was not ready within {timed_out_after:g} s (SLOTSERVE_LOAD_TIMEOUT_SECONDS)."
    # The run log begins with the command it ran ("$ …": its paths and port): staff read it
    # there; the reason, which everyone reads, tells what the process said.
    said = [line for line in log_tail.strip().splitlines() if line.strip() and not line.startswith("$ ")]
    last = said[-3:]
    tail = (" Last output: " + " | ".join(last)) if last else ""
    if exit_code is None and last and last[-1].startswith(LAUNCH_FAILED):
        return f"The process could not be started: {last[-1][len(LAUNCH_FAILED) :].strip()}"
    if exit_code is None:
        return "The process is gone (killed or crashed)." + tail
    if exit_code < 0:
        return f"The process was killed by signal {-exit_code}." + tail
    return f"The process exited with status {exit_code}." + tail
