"""Writes of the inventory: nodes, models and presets that other facts refer to."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from channels_app.models import (
    Channel,
    ChannelRuntime,
    ChannelTarget,
    LLMModel,
    Node,
    Preset,
    channel_gpus_problem,
    model_name_problem,
)
from channels_app.scheduling.selectors import channels_booked_with
from slotserve_base import dispatch
from slotserve_base.dispatch import enqueue_redecide
from slotserve_base.errors import InUse, InvalidInput
from slotserve_base.vocabulary import SERVING_PHASES, Phase


def _channels_using(*, model: LLMModel | None = None, preset: Preset | None = None) -> list[str]:
    running = ChannelRuntime.objects.filter(phase__in=[*SERVING_PHASES, Phase.STOPPING])
    wanted = ChannelTarget.objects.all()
    if model is not None:
        running, wanted = running.filter(model=model), wanted.filter(model=model)
    if preset is not None:
        running, wanted = running.filter(preset=preset), wanted.filter(preset=preset)
    names = set(running.values_list("channel__name", flat=True)) | set(
        wanted.values_list("channel__name", flat=True)
    )
    return sorted(names)


def model_register(*, name: str, backend: str, path: str, size_bytes: int, nodes: Iterable[Node]) -> LLMModel:
    """A model for a file a node worker found; named like another model or an alias: refused."""
    if LLMModel.objects.filter(name=name).exists():
        raise InvalidInput("name", f"a model named {name} exists already: register this file in the admin")
    problem = model_name_problem(name)
    if problem:
        raise InvalidInput("name", problem + ", or register this file in the admin under another name")
    with transaction.atomic():
        model = LLMModel.objects.create(name=name, backend=backend, path=path, size_bytes=size_bytes)
        model.nodes.set(nodes)
    return model


def model_delete(*, model: LLMModel) -> None:
    """Delete a model no channel runs or is heading for; its presets go with it.

    Reservations that name it keep it (``PROTECT``): the database refuses, and
    the API answers 409 naming them.
    """
    using = _channels_using(model=model)
    if using:
        raise InUse(f"cannot delete model {model.name}: channel {', '.join(using)} runs it or is about to")
    with transaction.atomic():
        model.delete()


def preset_delete(*, preset: Preset) -> None:
    using = _channels_using(preset=preset)
    if using:
        raise InUse(f"cannot delete preset {preset}: channel {', '.join(using)} runs it or is about to")
    with transaction.atomic():
        preset.delete()


def channel_save(*, channel: Channel, allowed_groups: Iterable[Group] | None = None) -> Channel:
    """Create or change a channel: its GPUs exist on its node and are no other channel's
    (checked under a lock of the node, and by the database's ``GpuClaim``), then the channel
    re-decides at once, as a changed default is a changed target (docs/scheduling.md). ``allowed_groups``,
    when given, replaces the groups that may book it (none: everyone), in the same transaction."""
    with transaction.atomic():
        Node.objects.select_for_update().filter(pk=channel.node_id).first()  # one claim at a time
        problem = channel_gpus_problem(
            node=channel.node, gpu_indexes=channel.gpu_indexes, channel_id=channel.pk
        )
        if problem:
            raise InvalidInput("gpu_indexes", problem)
        try:
            channel.save()
        except IntegrityError:
            raise InvalidInput(
                "gpu_indexes",
                "one of these GPUs was just given to another channel of this node; reload and retry",
            ) from None
        if allowed_groups is not None:
            channel.allowed_groups.set(allowed_groups)
    enqueue_redecide(channel.pk)
    return channel


def targets_changed(*, model: LLMModel | None = None, preset: Preset | None = None) -> list[int]:
    """A model or preset was edited: every channel that runs it or is heading for it has its node
    look again at once (after the commit), as what runs may now be another target (a changed
    path or arguments: drain, restart; ``slotserve_base.target``). Returns those channels.

    Every channel that may use it, running it, heading for it, defaulting to it or with a
    booking of it ahead, also re-decides at once (seed: "immediately after a reservation or
    model change"): a changed file size is a changed load estimate, and so a changed preload
    window and short-gap rule."""
    runs = Q(runtime__preset=preset) | Q(target__preset=preset) if preset is not None else Q()
    uses = Q(default_preset=preset) if preset is not None else Q()
    if model is not None:
        runs |= Q(runtime__model=model) | Q(target__model=model)
        uses |= Q(default_model=model)
    if not runs:
        return []
    found = list(Channel.objects.filter(runs).values_list("pk", "node__name").distinct())
    deciding = {pk for pk, _ in found}
    deciding |= set(Channel.objects.filter(uses).values_list("pk", flat=True))
    deciding |= channels_booked_with(model=model, preset=preset, after=timezone.now())

    def tell_nodes() -> None:
        for channel_id, node_name in found:
            dispatch.send_to_node(dispatch.CHANNEL_RECONCILE, (channel_id,), node_name)

    transaction.on_commit(tell_nodes, robust=True)  # Redis away: the nodes' own ticks see it
    for channel_id in sorted(deciding):
        enqueue_redecide(channel_id)
    return [channel_id for channel_id, _ in found]
