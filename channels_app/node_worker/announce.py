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

from channels_app.models import LLMModel, LoadRecord
from channels_app.node_worker.lifecycle import Action, ProcessState, Tell
from slotserve_base.happenings import Happening, named, tell, user_ref
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


def announce_channel(
    channel: Channel,
    target_row: ChannelTarget | None,
    before: ProcessState,
    after: ProcessState,
    actions: Sequence[Action],
    load_id: int | None,
    now: datetime,
) -> None:
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
