"""The switching gate stays closed until every gateway's snapshot has seen the old process go
(docs/gateway.md, "Draining"): a quick switch (nothing to drain) must not reopen the gate while
a snapshot up to ``SLOTSERVE_GATEWAY_REFRESH_SECONDS`` old still shows the old process ready."""

from __future__ import annotations

from datetime import timedelta

from channels_app.models import ChannelRuntime, ChannelTarget
from channels_app.node_worker import rows, worker
from channels_app.node_worker.gate import publish_gate
from slotserve_base.redis_client import redis_client
from slotserve_base.vocabulary import Phase, RedisKey, redis_key
from tests import factories
from tests.clock import T0
from tests.conftest import serve


def test_a_quick_switch_keeps_the_gate_closed_for_a_snapshots_age(db, settings, frozen):
    settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS = 1.0
    old, new = factories.llm("old"), factories.llm("new")
    channel = factories.channel("ch")
    serve(channel, old, 9)
    target = ChannelTarget.objects.create(channel=channel, model=new, reason="manual_override")
    wanted = rows.wanted_of(channel, target)
    gate = redis_key(RedisKey.GATE, channel.pk)
    redis_client().delete(gate)

    def closed_at(seconds: float, phase: Phase) -> bool:
        ChannelRuntime.objects.filter(channel=channel).update(phase=phase)
        state = worker._adopt_unknown_fingerprints(
            rows.state_of(ChannelRuntime.objects.get(channel=channel)), wanted
        )
        publish_gate(channel.pk, state, wanted, T0 + timedelta(seconds=seconds))
        return bool(redis_client().exists(gate))

    assert closed_at(0, Phase.READY), "the switch closes the gate"
    # Nothing to drain: the old process stopped at once and the new one loads. A snapshot read
    # just before the gate closed still shows the old process ready on its port.
    assert closed_at(0.3, Phase.LOADING)
    assert closed_at(1.9, Phase.LOADING)
    assert 0 < redis_client().pttl(gate) <= 100, "and it opens by itself then, with no tick to wait for"
    assert not closed_at(2.1, Phase.LOADING), "open once every snapshot shows the switch"
    # A long switch keeps it closed while it lasts, as before.
    assert closed_at(10, Phase.READY) and closed_at(700, Phase.DRAINING)
    assert redis_client().ttl(gate) > 500, "the gate's expiry is renewed while the switch lasts"


def test_a_gate_closed_by_the_last_release_opens_as_before(db, settings, frozen):
    channel, model = factories.channel("ch"), factories.llm("m")
    serve(channel, model, 9)
    target = ChannelTarget.objects.create(channel=channel, model=model, reason="default")
    gate = redis_key(RedisKey.GATE, channel.pk)
    redis_client().set(gate, "1")
    wanted = rows.wanted_of(channel, target)
    state = worker._adopt_unknown_fingerprints(
        rows.state_of(ChannelRuntime.objects.get(channel=channel)), wanted
    )
    publish_gate(channel.pk, state, wanted, T0)
    assert not redis_client().exists(gate)


def test_a_switch_from_a_process_ready_since_the_last_gate_closed_closes_it_anew(db, settings, frozen):
    """A gateway lets a request through a closed gate when its snapshot shows the process ready
    since after the gate closed (docs/gateway.md, "Draining"): the switch's new process. When
    that process is left in turn before the gate opened, the gate must say so, or a snapshot
    showing it ready would be let through to a process being stopped."""
    settings.SLOTSERVE_GATEWAY_REFRESH_SECONDS = 1.0
    old, new = factories.llm("old"), factories.llm("new")
    channel = factories.channel("ch")
    serve(channel, old, 9)
    gate = redis_key(RedisKey.GATE, channel.pk)
    redis_client().set(gate, repr(T0.timestamp()))  # the last switch's, still closed
    ChannelRuntime.objects.filter(channel=channel).update(since=T0 + timedelta(seconds=0.5))
    target = ChannelTarget.objects.create(channel=channel, model=new, reason="manual_override")
    wanted = rows.wanted_of(channel, target)
    state = worker._adopt_unknown_fingerprints(
        rows.state_of(ChannelRuntime.objects.get(channel=channel)), wanted
    )
    publish_gate(channel.pk, state, wanted, T0 + timedelta(seconds=0.8))
    assert float(redis_client().get(gate)) == (T0 + timedelta(seconds=0.8)).timestamp()
    # Later steps of the same switch keep the moment it closed.
    ChannelRuntime.objects.filter(channel=channel).update(phase=Phase.STOPPING)
    stopping = worker._adopt_unknown_fingerprints(
        rows.state_of(ChannelRuntime.objects.get(channel=channel)), wanted
    )
    publish_gate(channel.pk, stopping, wanted, T0 + timedelta(seconds=1.2))
    assert float(redis_client().get(gate)) == (T0 + timedelta(seconds=0.8)).timestamp()
