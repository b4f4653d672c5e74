"""Node workers find model files in SLOTSERVE_MODEL_DIRS and staff register them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from channels_app.models import LLMModel, ModelFile
from channels_app.node_worker import registration
from devtools.tinymodel import write_tiny_llama
from tests import factories


@pytest.fixture
def model_dir(tmp_path, settings):
    settings.SLOTSERVE_MODEL_DIRS = [str(tmp_path / "models"), str(tmp_path / "missing")]
    settings.SLOTSERVE_FAKE_GPUS = "1x24GiB"
    write_tiny_llama(tmp_path / "models" / "tiny.gguf")
    hf = tmp_path / "models" / "org" / "qwen-hf"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / "models" / "notes.txt").write_text("not a model")
    return tmp_path / "models"


@pytest.mark.django_db
def test_heartbeat_reports_files_and_where_registered_models_are(model_dir, staff_api):
    registered = LLMModel.objects.create(name="tiny", backend="llama.cpp", path=str(model_dir / "tiny.gguf"))
    node = registration.heartbeat(node_name="gpu1", now=timezone.now())
    found = {(f.path, f.backend) for f in ModelFile.objects.filter(node=node)}
    assert found == {
        (str(model_dir / "tiny.gguf"), "llama.cpp"),
        (str(model_dir / "org" / "qwen-hf"), "vllm"),
    }
    assert list(registered.nodes.values_list("name", flat=True)) == ["gpu1"]
    offered = staff_api.get("/api/model-files/", {"registered": "false"}).data
    assert [(f["path"], f["size_bytes"]) for f in offered] == [(str(model_dir / "org" / "qwen-hf"), 1000)]
    # The file goes away: the node no longer holds the model.
    (model_dir / "tiny.gguf").unlink()
    registration.heartbeat(node_name="gpu1", now=timezone.now())
    assert registered.nodes.count() == 0
    assert not ModelFile.objects.filter(path=str(model_dir / "tiny.gguf")).exists()


@pytest.mark.django_db
def test_staff_register_a_found_file_from_the_models_page(model_dir, staff, ana):
    registration.heartbeat(node_name="gpu1", now=timezone.now())
    found = ModelFile.objects.get(backend="vllm")
    portal = Client()
    portal.force_login(ana)
    page = portal.get("/models/").content.decode()
    assert "Found on nodes, not registered" in page and "qwen-hf" in page and "Register" not in page
    assert portal.post(f"/models/files/{found.pk}/register").status_code == 302  # to the admin sign-in
    portal.force_login(staff)
    portal.post(f"/models/files/{found.pk}/register")
    model = LLMModel.objects.get(name="qwen-hf")
    assert (model.backend, model.size_bytes, list(model.nodes.values_list("name", flat=True))) == (
        "vllm",
        1000,
        ["gpu1"],
    )
    after = portal.get("/models/").content.decode()
    assert f'data-file="{found.path}"' not in after  # no longer offered
    assert f'data-file="{model_dir / "tiny.gguf"}"' in after


@pytest.mark.django_db
def test_models_page_shows_memory_estimates(tiny_gguf, ana):
    model = factories.llm("tiny")
    model.path = str(tiny_gguf)
    model.save()
    factories.preset(model, "short", "-c 128")
    portal = Client()
    portal.force_login(ana)
    page = portal.get("/models/").content.decode()
    assert "128 tokens" in page and "KV cache" in page


@pytest.mark.django_db
def test_estimates_work_on_a_host_without_the_file_from_what_the_node_reported(
    model_dir, ana_api, monkeypatch
):
    """The node reads the GGUF metadata; a web host that has no file estimates from that."""
    from channels_app.models import Gpu
    from channels_app.placement import memory
    from channels_app.placement.estimates import model_memory_estimate

    path = str(model_dir / "tiny.gguf")
    model = LLMModel.objects.create(name="tiny", backend="llama.cpp", path=path)  # no size given
    node = registration.heartbeat(node_name="gpu1", now=timezone.now())
    reported = ModelFile.objects.get(node=node, path=path)
    assert reported.shape is not None and reported.shape["n_layers"] > 0 and reported.shape_error == ""
    broken = ModelFile.objects.get(node=node, path=str(model_dir / "org" / "qwen-hf"))
    assert broken.shape is None and "config.json" in broken.shape_error  # said why, once
    model.refresh_from_db()
    assert model.size_bytes == reported.size_bytes > 0  # discovery corrects a missing size
    here = model_memory_estimate(model, ["-c", "256"])

    # The web host: reading the file fails there.
    def nothing_here(*, backend: str, path: str) -> dict[str, object]:
        raise memory.ShapeUnreadable(f"{path}: no such file on this host")

    monkeypatch.setattr(memory, "read_shape", nothing_here)
    there = model_memory_estimate(model, ["-c", "256"])
    assert there == here
    # The booking dialog's hint fires from the reported shape on a channel too small for it.
    small = factories.node("small", gpus=1, memory=1000)
    Gpu.objects.filter(node=small).update(free_bytes=500)
    channel = factories.channel("tight", on=small)
    start = timezone.now() + timedelta(hours=1)
    hints = ana_api.get(
        "/api/reservations/hints",
        {
            "channel": channel.pk,
            "start": start.isoformat(),
            "end": (start + timedelta(hours=1)).isoformat(),
            "model": model.pk,
        },
    )
    codes = {w["code"] for w in hints.data["warnings"]}
    assert "estimated_memory_exceeds_vram" in codes, hints.data
