"""SPEC section 4: arguments SlotServe owns are removed from presets."""

import pytest

from channels_app.backends import Backend, effective_args

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
]


@pytest.mark.parametrize(("backend", "args", "expected"), CASES)
def test_owned_arguments_removed(backend, args, expected):
    assert effective_args(backend, args) == expected
