"""Node workers find model files in SLOTSERVE_MODEL_DIRS and staff register them."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from channels_app.models import LLMModel, ModelFile
from channels_app.node_agent import worker
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
    node = worker.heartbeat(node_name="gpu1", now=timezone.now())
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
    worker.heartbeat(node_name="gpu1", now=timezone.now())
    assert registered.nodes.count() == 0
    assert not ModelFile.objects.filter(path=str(model_dir / "tiny.gguf")).exists()


@pytest.mark.django_db
def test_staff_register_a_found_file_from_the_models_page(model_dir, staff, ana):
    worker.heartbeat(node_name="gpu1", now=timezone.now())
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
