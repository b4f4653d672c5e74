"""A preset that cannot be launched fails like a failed load and wedges nothing: the admin and
the API refuse it; one forced into the database fails its channel with a shown error, while the
node's other channel keeps working and every page still answers."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from channels_app.models import ChannelRuntime, LoadRecord, Preset
from channels_app.node_worker.tasks import node_tick
from channels_app.scheduling.services import decide_channels
from slotserve_base.vocabulary import Phase
from tests import factories

UNBALANCED = '-c "256 -ngl 99'


@pytest.mark.django_db
def test_the_admin_form_and_the_api_refuse_an_unsplittable_preset(staff):
    model = factories.llm("qwen")
    staff.is_superuser = True
    staff.save()
    admin = Client()
    admin.force_login(staff)
    answer = admin.post(
        "/admin/channels_app/preset/add/", {"model": model.pk, "name": "bad", "args": UNBALANCED}
    )
    assert answer.status_code == 200 and "cannot split the arguments" in answer.content.decode()
    api = APIClient()
    api.force_authenticate(staff)
    refused = api.post("/api/presets/", {"model": model.pk, "name": "bad", "args": UNBALANCED})
    assert refused.status_code == 400 and "cannot split the arguments" in refused.data["message"]
    with_nul = api.post("/api/presets/", {"model": model.pk, "name": "nul", "args": "-c 1\x00"})
    assert with_nul.status_code == 400
    assert not Preset.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_bad_preset_in_the_database_fails_its_channel_only(node_env, tmp_path, ana, staff):
    model_file = tmp_path / "m.gguf"
    model_file.write_bytes(b"GGUF")
    node = factories.node("n1", gpus=2)
    bad_model = factories.llm("bad-model", path=str(model_file))
    bad = factories.preset(bad_model, "ok")
    Preset.objects.filter(pk=bad.pk).update(args=UNBALANCED)  # as an old admin form let it through
    good_model = factories.llm("good-model", backend="vllm", path=str(model_file))
    good = factories.preset(good_model, "fast", "--standin-load-seconds 0")
    broken = factories.channel("broken", on=node, default=bad, gpu_indexes=[0])
    working = factories.channel("working", on=node, default=good, gpu_indexes=[1])
    decide_channels(now=timezone.now())

    for _ in range(40):  # the node's ticks, as its worker runs them
        node_tick(node.name)
        if ChannelRuntime.objects.filter(channel=working, phase=Phase.READY).exists():
            break
    assert ChannelRuntime.objects.get(channel=working).phase == Phase.READY
    failed = ChannelRuntime.objects.get(channel=broken)
    assert failed.phase == Phase.FAILED
    assert failed.error.startswith("The process could not be started: preset bad-model/ok")
    assert "No closing quotation" in failed.error, failed.error
    assert failed.retry_at is not None  # the retry rules apply as to any failed load
    assert LoadRecord.objects.get(channel=broken).succeeded is False
    assert "No closing quotation" in Path(failed.log_path).read_text()

    # Everyone's pages and the API still answer, and say what is wrong with the preset.
    api = APIClient()
    api.force_authenticate(ana)
    presets = api.get("/api/presets/")
    assert presets.status_code == 200
    shown = next(p for p in presets.data if p["id"] == bad.pk) if isinstance(presets.data, list) else None
    if shown is None:
        shown = next(p for p in presets.data["results"] if p["id"] == bad.pk)
    assert shown["args_effective"] == [] and "No closing quotation" in shown["args_error"]
    assert "No closing quotation" in api.get(f"/api/channels/{broken.pk}/").data["state"]["error"]
    portal = Client()
    portal.force_login(ana)
    assert portal.get("/models/").status_code == 200
    assert portal.get("/").status_code == 200
