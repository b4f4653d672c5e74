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
    # vLLM runs the ASGI middleware it is named: SlotServe's guard is the only one.
    (
        Backend.VLLM,
        ["--middleware", "evil.Open", "--middleware=evil.Two", "--enable-sleep-mode"],
        ["--enable-sleep-mode"],
    ),
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


def test_a_vllm_run_that_can_sleep_is_started_behind_slotservess_guard(tmp_path):
    """docs/security.md: the sleep endpoints come with vLLM's development mode, which its own key
    does not guard; the run gets SlotServe's middleware and the folder it is imported from."""
    import os

    from channels_app.node_worker import processes, sleep_mode

    launch = processes.Launch(
        backend=Backend.VLLM,
        executable="vllm",
        model_path="/m",
        alias="m",
        preset_args=["--middleware", "evil.Open"],
        gpu_indexes=[0],
        host="127.0.0.1",
        log_dir=tmp_path,
        sleep_mode=True,
    )
    argv = processes.command_line(launch, 31000)
    assert argv[argv.index("--middleware") + 1] == "slotserve_vllm_guard.RequireSecret"
    assert argv.count("--middleware") == 1 and "--enable-sleep-mode" in argv
    env = sleep_mode.launch_env({"PYTHONPATH": "/lab/lib"})
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(sleep_mode.GUARD_DIR), "/lab/lib"]
    assert (sleep_mode.GUARD_DIR / "slotserve_vllm_guard.py").is_file()
    without = processes.command_line(processes.Launch(**{**launch.__dict__, "sleep_mode": False}), 31000)
    assert "--middleware" not in without and "--enable-sleep-mode" not in without


@pytest.mark.parametrize(
    ("secret", "path", "sent", "passes"),
    [
        ("s3cret", "/health", "", True),
        ("s3cret", "/sleep", "", False),
        ("s3cret", "/wake_up", "Bearer guess", False),
        ("s3cret", "/collective_rpc", "Bearer s3cret", True),
        ("", "/is_sleeping", "Bearer ", False),  # no secret set: nothing but /health answers
    ],
)
def test_slotservess_guard_asks_the_runs_secret_of_every_path_but_health(
    monkeypatch, secret, path, sent, passes
):
    import asyncio

    from channels_app.node_worker.vllm_guard.slotserve_vllm_guard import RequireSecret

    monkeypatch.setenv("VLLM_API_KEY", secret)
    reached, answered = [], []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def send(message):
        answered.append(message)

    headers = [(b"authorization", sent.encode())] if sent else []
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    asyncio.run(RequireSecret(app)(scope, None, send))
    assert bool(reached) is passes
    if not passes:
        assert answered[0]["status"] == 401
