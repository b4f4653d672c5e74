"""scripts/gpu-check on a machine without an NVIDIA GPU (docs/deploy.md, "Checking a GPU node"):
the GPU checks are skipped with a clear reason, and SlotServe's own NVML code meets the missing
driver as a node does: no GPUs, and NVML's reason in its log."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    shutil.which("nvidia-smi") is not None, reason="a GPU machine runs the GPU checks themselves"
)


def test_without_a_gpu_the_gpu_checks_are_skipped_and_the_node_falls_back_with_the_reason(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu-check"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("SKIP gpu: no NVIDIA GPU here (NVML: ")
    reason = lines[0].split("(NVML: ", 1)[1].split(")")[0]
    assert lines[1].startswith("PASS nvml-fallback: the node reports no GPUs and logs why")
    assert f"no NVIDIA GPUs found through NVML ({reason})" in lines[1]
    assert [line.split(":")[0] for line in lines[2:]] == [
        "SKIP build",
        "SKIP load",
        "SKIP fill",
        "SKIP used-memory",
        "SKIP out-of-memory",
        "SKIP sleep-wake",
    ]


def test_a_cuda_build_without_the_driver_says_what_is_missing(tmp_path):
    done = subprocess.run(
        [str(ROOT / "scripts" / "build-llama-server"), "--cuda"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "SLOTSERVE_CACHE": str(tmp_path)},
    )
    assert done.returncode == 1
    assert "--cuda needs nvcc" in done.stderr or "--cuda needs nvidia-smi" in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing half-built


def test_without_slotserves_packages_the_script_says_how_to_get_them(tmp_path):
    done = subprocess.run(
        [sys.executable, "-S", str(ROOT / "scripts" / "gpu-check"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "needs Django and httpx" in done.stderr and "--prepare" in done.stderr
