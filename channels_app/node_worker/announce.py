"""A channel's events for the webhooks (docs/webhooks.md): what a reconcile changed, told with
``slotserve_base.happenings``.

``channel_events`` is pure: from the state before and after one step and the step's actions, the
events in the order they happened. ``announce`` adds the objects' names and whom they concern
(the booker of the reservation the channel serves).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from channels_app import story
from channels_app.models import LLMModel, LoadRecord, StoryKind
from channels_app.node_worker.lifecycle import Action, ProcessState, Tell
from slotserve_base.happenings import Happening, named, tell, user_ref
from slotserve_base.iso import iso_moment
from slotserve_base.vocabulary import NotificationEvent, Phase, WebhookEvent

if TYPE_CHECKING:
    from channels_app.models import Channel, ChannelTarget

# The lifecycle's news (``Tell``) as events.
TOLD = {
    NotificationEvent.LOAD_FAILED: WebhookEvent.CHANNEL_FAILED,
    NotificationEvent.FALLBACK: WebhookEvent.CHANNEL_FALLBACK,
    NotificationEvent.RECOVERED: WebhookEvent.CHANNEL_RECOVERED,
}


def channel_events(
    before: ProcessState, after: ProcessState, actions: Sequence[Action]
) -> list[WebhookEvent]:
    """The events of one step: a failure, a fallback or a recovery the lifecycle tells of, a load
    begun, a model ready."""
    events = [TOLD[NotificationEvent(a.event)] for a in actions if isinstance(a, Tell) and a.event in TOLD]
    if after.phase != before.phase:
        if after.phase == Phase.LOADING:
            events.append(WebhookEvent.CHANNEL_LOADING)
        elif after.phase == Phase.READY:
            events.append(WebhookEvent.CHANNEL_READY)
    return events


# A step's phase as the channel's story tells it (a failure, a fallback or a recovery that the
# lifecycle tells of is told as well).
STORY_PHASES = {
    Phase.LOADING: StoryKind.LOADING,
    Phase.READY: StoryKind.READY,
    Phase.FAILED: StoryKind.FAILED,
    Phase.DRAINING: StoryKind.DRAINING,
    Phase.STOPPING: StoryKind.STOPPING,
    Phase.STOPPED: StoryKind.STOPPED,
}
STORY_TOLD = {
    NotificationEvent.FALLBACK: StoryKind.FALLBACK,
    NotificationEvent.RECOVERED: StoryKind.RECOVERED,
}


def story_entries(
    before: ProcessState, after: ProcessState, actions: Sequence[Action]
) -> list[tuple[StoryKind, dict[str, Any]]]:
    """What one step adds to the channel's story, in order, with the step's facts."""
    entries: list[tuple[StoryKind, dict[str, Any]]] = []
    running = after.running or before.running
    facts: dict[str, Any] = {
        "model_id": running.model_id if running else None,
        "preset_id": running.preset_id if running else None,
        "fallback": after.fallback,
    }
    if after.phase != before.phase:
        kind = STORY_PHASES[after.phase]
        data = dict(facts)
        failure = after.failure
        if kind == StoryKind.FAILED:
            data["error"] = after.error or before.error
            if failure is not None:
                data.update(attempts=failure.attempts, retry_at=iso_moment(failure.retry_at))
        elif kind == StoryKind.LOADING and failure is not None and failure.target == after.running:
            data["attempt"] = failure.attempts + 1
        entries.append((kind, data))
    entries.extend(
        (STORY_TOLD[NotificationEvent(a.event)], dict(facts))
        for a in actions
        if isinstance(a, Tell) and a.event in STORY_TOLD
    )
    return entries


def announce_channel(
    channel: Channel,
    target_row: ChannelTarget | None,
    before: ProcessState,
    after: ProcessState,
    actions: Sequence[Action],
    load_id: int | None,
    now: datetime,
) -> None:
    entries = story_entries(before, after, actions)
    booking_id = target_row.reservation_id if target_row is not None else None
    for kind, facts in entries:
        if kind == StoryKind.READY and load_id is not None:
            load = LoadRecord.objects.filter(pk=load_id).first()
            facts["load_seconds"] = load.duration_seconds if load is not None else None
        story.told(channel.pk, now, kind, booking_id=booking_id, **facts)
    events = channel_events(before, after, actions)
    if not events:
        return
    running = after.running or before.running
    model = LLMModel.objects.filter(pk=running.model_id).first() if running is not None else None
    reservation = target_row.reservation if target_row is not None else None
    switched_from: Any = None
    if WebhookEvent.CHANNEL_READY in events:
        previous = (
            LoadRecord.objects.filter(channel=channel, succeeded=True)
            .exclude(pk=load_id or 0)
            .select_related("model")
            .order_by("-started", "-pk")
            .first()
        )
        if previous is not None and model is not None and previous.model_id != model.pk:
            events.append(WebhookEvent.CHANNEL_SWITCHED)
            switched_from = named(previous.model)
            story.told(
                channel.pk, now, StoryKind.SWITCHED, model_id=model.pk, previous_model_id=previous.model_id
            )
    for event in events:
        data: dict[str, Any] = {
            "channel": named(channel),
            "node": named(channel.node),
            "model": named(model),
            "fallback": after.fallback,
            "booking": None
            if reservation is None
            else {"id": reservation.pk, "user": user_ref(reservation.user)},
        }
        if event in (WebhookEvent.CHANNEL_FAILED, WebhookEvent.CHANNEL_FALLBACK):
            data["error"] = after.error or before.error
        if event == WebhookEvent.CHANNEL_SWITCHED:
            data["previous_model"] = switched_from
        tell(
            Happening(
                type=event,
                at=now,
                data=data,
                subject=f"channel:{channel.pk}",
                words=_words(event, channel, model, data),
                users=frozenset() if reservation is None else frozenset({reservation.user_id}),
                channels=frozenset({channel.pk}),
                link="/",
            )
        )


def _words(event: WebhookEvent, channel: Channel, model: LLMModel | None, data: dict[str, Any]) -> str:
    what = model.name if model is not None else "its model"
    said = {
        WebhookEvent.CHANNEL_LOADING: f"loading {what}",
        WebhookEvent.CHANNEL_READY: f"{what} is ready",
        WebhookEvent.CHANNEL_FAILED: f"{what} failed: {data.get('error') or 'no reason given'}",
        WebhookEvent.CHANNEL_FALLBACK: "serves its default model until the booked one is retried",
        WebhookEvent.CHANNEL_RECOVERED: f"{what} serves again after a failure",
        WebhookEvent.CHANNEL_SWITCHED: f"switched from {(data.get('previous_model') or {}).get('name')} "
        f"to {what}",
    }[event]
    booking = data["booking"]
    for_whom = f" (the booking of {booking['user']['username']})" if booking else ""
    return f"Channel {channel.name}: {said}{for_whom}."
