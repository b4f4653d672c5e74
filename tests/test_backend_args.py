"""docs/scheduling.md: arguments SlotServe owns are removed from presets."""

import pytest

from channels_app.backends import Backend, effective_args, places_asked

CASES = [
    (Backend.LLAMA_CPP, ["-c", "8192", "-ngl", "99"], ["-c", "8192", "-ngl", "99"]),
    (Backend.LLAMA_CPP, ["-m", "/x.gguf", "-c", "4096"], ["-c", "4096"]),
    (Backend.LLAMA_CPP, ["--model=/x.gguf", "--port", "1", "--host=0.0.0.0"], []),
    (Backend.LLAMA_CPP, ["-a", "name", "--alias=other", "-ngl", "-1"], ["-ngl", "-1"]),
    (Backend.LLAMA_CPP, ["--port"], []),
    (Backend.LLAMA_CPP, ["--port", "--jinja"], ["--jinja"]),
    (Backend.LLAMA_CPP, ["--model-url", "u"], ["--model-url", "u"]),
    (Backend.VLLM, ["--model", "m", "--max-model-len", "8192"], ["--max-model-len", "8192"]),
    (Backend.VLLM, ["--served-model-name", "a", "b", "--dtype", "half"], ["--dtype", "half"]),
    (Backend.VLLM, ["--host=::", "--port=9", "--tensor-parallel-size", "2"], ["--tensor-parallel-size", "2"]),
    (Backend.SGLANG, ["--model-path", "p", "--tp", "2"], ["--tp", "2"]),
    (
        Backend.SGLANG,
        ["--served-model-name=x", "--mem-fraction-static", "0.8"],
        ["--mem-fraction-static", "0.8"],
    ),
    (Backend.SGLANG, ["-m", "keep"], ["-m", "keep"]),
    # argparse (vLLM, SGLang) takes any unique prefix of a long option: an abbreviation of an
    # owned option is owned too, for every backend.
    (Backend.VLLM, ["--hos", "0.0.0.0", "--dtype", "half"], ["--dtype", "half"]),
    (Backend.VLLM, ["--por=1", "--served-model", "x", "--ho=::"], []),
    (Backend.SGLANG, ["--api-k", "mine", "--tp", "2"], ["--tp", "2"]),
    (Backend.SGLANG, ["--model-pa", "p", "--served", "x", "y", "--conf", "c.yaml"], []),
    (Backend.LLAMA_CPP, ["--hos", "0.0.0.0", "--al", "x", "-c", "256"], ["-c", "256"]),
    # The run's secret is SlotServe's: a preset can neither replace it nor add a key of its own.
    (Backend.LLAMA_CPP, ["--api-key", "k", "--api-key-file=/tmp/k", "-ngl", "9"], ["-ngl", "9"]),
    (
        Backend.VLLM,
        ["--api-key=k", "--config", "mine.yaml", "--max-model-len", "8"],
        ["--max-model-len", "8"],
    ),
    (Backend.VLLM, ["--h", "0.0.0.0", "--hf-token", "t"], ["--hf-token", "t"]),
    # Not abbreviations: a longer option of its own, or a value.
    (Backend.LLAMA_CPP, ["--model-url", "u", "-ngl", "-1"], ["--model-url", "u", "-ngl", "-1"]),
]


@pytest.mark.parametrize(("backend", "args", "expected"), CASES)
def test_owned_arguments_removed(backend, args, expected):
    assert effective_args(backend, args) == expected


@pytest.mark.parametrize(
    ("backend", "args", "places"),
    [
        (Backend.LLAMA_CPP, ["-np", "4", "-c", "2048"], 4),
        (Backend.LLAMA_CPP, ["--parallel=3"], 3),
        (Backend.LLAMA_CPP, ["-np", "-1"], None),  # "auto": only the process knows
        (Backend.LLAMA_CPP, [], None),
        (Backend.VLLM, ["--max-num-seqs", "64"], 64),
        (Backend.VLLM, ["--dtype", "half"], 256),  # vLLM's default
        (Backend.SGLANG, ["--max-running-requests", "32"], 32),
        (Backend.SGLANG, ["--max-running-requests", "many"], None),
    ],
)
def test_the_places_a_process_serves_at_once_as_its_arguments_tell(backend, args, places):
    assert places_asked(backend, args) == places
