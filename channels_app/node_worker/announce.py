"""What one reconcile changed, told once (docs/architecture.md, "What happened, told once").

``channel_facts`` is pure: from the state before and after one step and the step's actions, the
facts in the order they happened, each a happening's type and its facts of the process.
``announce_channel`` adds the objects' names and whom they concern (the booker of the reservation
the channel serves) and tells each as one ``Happening``. Who keeps what is the listeners' choice:
the channel's story (``channels_app.story``), the notifications (``reservations.notices``) and
the webhooks.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction

from channels_app.models import LLMModel, LoadRecord
from channels_app.node_worker.lifecycle import Action, ProcessState, Tell
from channels_app.node_worker.step_reads import StepReads
from slotserve_base.happenings import Happening, named, tell, user_ref
from slotserve_base.iso import iso_moment
from slotserve_base.vocabulary import Phase, WebhookEvent

if TYPE_CHECKING:
    from channels_app.models import Channel, ChannelTarget

# A phase reached, as what happened. A run that failed is told when it fails (``Tell``), so the
# failed phase it rests in afterwards is not told again.
PHASE_REACHED = {
    Phase.LOADING: WebhookEvent.CHANNEL_LOADING,
    Phase.READY: WebhookEvent.CHANNEL_READY,
    Phase.DRAINING: WebhookEvent.CHANNEL_DRAINING,
    Phase.STOPPING: WebhookEvent.CHANNEL_STOPPING,
    Phase.STOPPED: WebhookEvent.CHANNEL_STOPPED,
}

# The lifecycle's facts that come before the phase they lead to (a failure stops the run, a
# fallback loads the default); a recovery is a meaning of the ready it comes with, told after it.
CAUSES = (WebhookEvent.CHANNEL_FAILED, WebhookEvent.CHANNEL_FALLBACK)

Fact = tuple[WebhookEvent, dict[str, Any]]


def channel_facts(before: ProcessState, after: ProcessState, actions: Sequence[Action]) -> list[Fact]:
    """The happenings of one step, in order, each with the step's facts: the model and preset
    it is about, whether it is the fallback; a failure's error, attempts, next try and episode;
    a retry's attempt; whether what became ready is the booked model (``booked``)."""
    told = [a for a in actions if isinstance(a, Tell)]
    running = after.running or before.running
    common: dict[str, Any] = {
        "model_id": running.model_id if running else None,
        "preset_id": running.preset_id if running else None,
        "fallback": after.fallback,
    }

    def fact(event: WebhookEvent, **more: Any) -> Fact:
        return (event, {**common, **more})

    def episode_of(action: Tell) -> dict[str, Any]:
        return {"episode": iso_moment(action.episode)} if action.episode is not None else {}

    facts: list[Fact] = []
    for action in told:
        if action.event == WebhookEvent.CHANNEL_FAILED:
            failure = after.failure
            retry = (
                {}
                if failure is None
                else {"attempts": failure.attempts, "retry_at": iso_moment(failure.retry_at)}
            )
            facts.append(fact(action.event, error=after.error or before.error, **retry, **episode_of(action)))
        elif action.event == WebhookEvent.CHANNEL_FALLBACK:
            facts.append(fact(action.event, error=after.error or before.error, **episode_of(action)))
    reached = PHASE_REACHED.get(after.phase) if after.phase != before.phase else None
    if reached == WebhookEvent.CHANNEL_LOADING:
        failure = after.failure
        retried = failure is not None and failure.target == after.running
        woken = {"wake": True} if after.waking else {}  # a sleeper woken, not a load
        facts.append(
            fact(reached, **woken, **({"attempt": failure.attempts + 1} if retried and failure else {}))
        )
    elif reached == WebhookEvent.CHANNEL_READY:
        booked = any(a.event == WebhookEvent.CHANNEL_READY for a in told)
        woke = (
            {"woke_seconds": round((after.since - before.since).total_seconds(), 3)}
            if before.waking and after.since is not None and before.since is not None
            else {}
        )
        facts.append(fact(reached, booked=booked, **woke))
    elif reached == WebhookEvent.CHANNEL_STOPPING and after.sleeping_out:
        facts.append(fact(reached, sleep=True))  # put to sleep, to be woken for its next turn
    elif reached is not None:
        facts.append(fact(reached))
    facts.extend(fact(a.event, **episode_of(a)) for a in told if a.event == WebhookEvent.CHANNEL_RECOVERED)
    return facts


def announce_channel(
    channel: Channel,
    target_row: ChannelTarget | None,
    before: ProcessState,
    after: ProcessState,
    actions: Sequence[Action],
    load_id: int | None,
    now: datetime,
    reads: StepReads | None = None,
) -> None:
    """Tell the step's happenings, together: each listener keeps its rows in one transaction."""
    facts = channel_facts(before, after, actions)
    if not facts:
        return
    reservation = target_row.reservation if target_row is not None else None
    running = after.running or before.running
    reads = reads or StepReads()
    model = reads.model(running.model_id) if running is not None else None
    preset = reads.preset(running.preset_id) if running is not None else None
    objects: dict[str, Any] = {
        "channel": named(channel),
        "node": named(channel.node),
        "model": named(model),
        "preset": named(preset),
        "booking": None
        if reservation is None
        else {"id": reservation.pk, "user": user_ref(reservation.user)},
    }
    with transaction.atomic():
        for event, of_process in facts:
            data = {**objects, **of_process}
            del data["model_id"], data["preset_id"]
            if event == WebhookEvent.CHANNEL_READY:
                data["load_seconds"] = _load_seconds(load_id)
            _tell(channel, reservation, event, data, now)
        previous = (
            _switched_from(channel, model, load_id)
            if after.phase == Phase.READY and before.phase != Phase.READY
            else None
        )
        if previous is not None:
            switched = {**objects, "fallback": after.fallback, "previous_model": named(previous)}
            _tell(channel, reservation, WebhookEvent.CHANNEL_SWITCHED, switched, now)


def _load_seconds(load_id: int | None) -> float | None:
    load = LoadRecord.objects.filter(pk=load_id).first() if load_id is not None else None
    return load.duration_seconds if load is not None else None


def _switched_from(channel: Channel, model: LLMModel | None, load_id: int | None) -> LLMModel | None:
    """The model the channel served before this one, when it was another."""
    previous = (
        LoadRecord.objects.filter(channel=channel, succeeded=True)
        .exclude(pk=load_id or 0)
        .select_related("model")
        .order_by("-started", "-pk")
        .first()
    )
    if previous is None or model is None or previous.model_id == model.pk:
        return None
    return previous.model


def _tell(
    channel: Channel, reservation: Any, event: WebhookEvent, data: dict[str, Any], now: datetime
) -> None:
    about = f"channel:{channel.pk}" if reservation is None else f"reservation:{reservation.pk}"
    tell(
        Happening(
            type=event,
            at=now,
            data=data,
            subject=f"channel:{channel.pk}",
            words=_words(event, channel, data),
            users=frozenset() if reservation is None else frozenset({reservation.user_id}),
            channels=frozenset({channel.pk}),
            link="/",
            # A failure episode is told once to whoever tells people of it; the story keeps each.
            key=f"{event}:{about}:{data['episode']}"
            if event == WebhookEvent.CHANNEL_FAILED and "episode" in data
            else None,
        )
    )


def _words(event: WebhookEvent, channel: Channel, data: dict[str, Any]) -> str:
    what = (data.get("model") or {}).get("name") or "its model"
    said = {
        WebhookEvent.CHANNEL_LOADING: f"waking {what}" if data.get("wake") else f"loading {what}",
        WebhookEvent.CHANNEL_READY: f"{what} is ready"
        + (f", woken in {data['woke_seconds']:g} s" if data.get("woke_seconds") is not None else ""),
        WebhookEvent.CHANNEL_FAILED: f"{what} failed: {data.get('error') or 'no reason given'}",
        WebhookEvent.CHANNEL_FALLBACK: "serves its default model until the booked one is retried",
        WebhookEvent.CHANNEL_RECOVERED: f"{what} serves again after a failure",
        WebhookEvent.CHANNEL_SWITCHED: f"switched from {(data.get('previous_model') or {}).get('name')} "
        f"to {what}",
        WebhookEvent.CHANNEL_DRAINING: f"requests in flight finish before {what} stops",
        WebhookEvent.CHANNEL_STOPPING: f"putting {what} to sleep (its weights to host RAM)"
        if data.get("sleep")
        else f"stopping {what}",
        WebhookEvent.CHANNEL_STOPPED: f"{what} has stopped",
    }[event]
    booking = data["booking"]
    for_whom = f" (the booking of {booking['user']['username']})" if booking else ""
    return f"Channel {channel.name}: {said}{for_whom}."
