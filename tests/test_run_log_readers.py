"""Who reads a channel's run log (docs/node-workers.md, "Run logs"): the channel's story rule —
members read the channels they may book, staff every one — and the lines about single requests
(their tokens, prompt-cache similarity, timings) are staff's alone."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from rest_framework.test import APIClient

from channels_app.node_worker.log_shipping import _add
from tests import factories

pytestmark = pytest.mark.django_db

LINES = [
    "main: model loaded",
    "main: server is listening on http://127.0.0.1:41234",
    "slot get_availabl: id  0 | task -1 | selected slot by LCP similarity, sim_best = 0.875 (> 0.100 thold)",
    "slot launch_slot_: id  0 | task 12 | processing task",
    "slot print_timing: id  0 | task 12 | prompt eval time =       2.33 ms /    56 tokens",
    "srv  log_server_r: request: POST /v1/chat/completions 127.0.0.1 200",
    "INFO 12-06 10:00:01 [logger.py:43] Received request chatcmpl-9a: prompt: '...', params: SamplingParams",
    "srv  update_slots: all slots are idle",
]


def test_members_read_the_run_log_of_channels_they_may_book_without_request_lines(ana, staff):
    open_channel = factories.channel("open-0")
    kept = factories.channel("vision-0")
    kept.allowed_groups.add(Group.objects.create(name="vision"))
    for channel in (open_channel, kept):
        _add(channel.pk, "run-1", LINES)
    member, admin = APIClient(), APIClient()
    member.force_authenticate(ana)
    admin.force_authenticate(staff)
    assert member.get(f"/api/channels/{kept.pk}/log").status_code == 404
    page = Client()
    page.force_login(ana)
    assert page.get(f"/channel/{kept.pk}/log").status_code == 404
    theirs = member.get(f"/api/channels/{open_channel.pk}/log").data["lines"]
    assert theirs == ["main: model loaded", "main: server is listening on http://127.0.0.1:41234",
                      "srv  update_slots: all slots are idle"], theirs  # fmt: skip
    shown = page.get(f"/channel/{open_channel.pk}/log").content.decode()
    assert "model loaded" in shown and "sim_best" not in shown and "56 tokens" not in shown
    assert admin.get(f"/api/channels/{kept.pk}/log").data["lines"] == LINES
