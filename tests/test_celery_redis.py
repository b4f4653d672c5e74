"""The full path through Celery with the real Redis broker: enqueue → worker → stored target."""

from __future__ import annotations

import uuid

import pytest
from celery.contrib.testing.worker import start_worker

from channels_app.models import ChannelTarget
from channels_app.scheduling.tasks import channel_redecide
from slotserve_site.celery import app as celery_app
from tests import factories
from tests.clock import eventually
from tests.queued import use_broker


@pytest.mark.django_db(transaction=True)
def test_redecide_task_travels_through_redis_to_a_worker(settings):
    channel = factories.channel("via-redis", default=factories.preset(factories.llm("m"), "p"))
    # A queue of this test's own, so parallel test processes never take each other's tasks.
    queue = f"test-{uuid.uuid4().hex}"
    use_broker(settings.CELERY_BROKER_URL)
    with start_worker(celery_app, pool="solo", perform_ping_check=False, queues=[queue], loglevel="WARNING"):
        channel_redecide.apply_async(args=(channel.pk,), queue=queue)
        assert eventually(
            lambda: ChannelTarget.objects.filter(channel=channel).exists(), timeout=20, every=0.05
        )
    target = ChannelTarget.objects.get(channel=channel)
    assert (target.model_id, target.reason) == (channel.default_model_id, "default")
