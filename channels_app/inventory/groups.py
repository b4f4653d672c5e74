"""A group that limits who may book a channel (``Channel.allowed_groups``) is deleted safely: a
restriction never fails open. A group that is some channel's only allowed group cannot be
deleted (the channel would open to everyone); one that goes from a channel that allows others
too leaves a record of the channel's change in the audit trail (docs/inventory.md)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, User
from django.db.models import Count, ProtectedError, QuerySet

from channels_app.models import Channel
from slotserve_base.audit import removed_with


def channels_only_allowing(groups: QuerySet[Group] | list[Group]) -> list[Channel]:
    """The channels whose only allowed group is one of ``groups``."""
    ids = [g.pk for g in groups]
    return list(
        Channel.objects.annotate(allowed=Count("allowed_groups"))
        .filter(allowed=1, allowed_groups__in=ids)
        .order_by("name")
    )


def refusal(group: Group, channels: list[Channel]) -> str:
    names = ", ".join(c.name for c in channels)
    return (
        f"group {group.name} is the only group allowed to book channel(s) {names}: deleting it would "
        "open them to everyone. Allow another group there first, or remove the group from the channel "
        "(which opens it, recorded as the channel's change)."
    )


def before_group_deleted(sender: Any, instance: Group, **_: Any) -> None:
    """``pre_delete`` of a group, whichever door deletes it (the admin, the shell, a directory
    sync): refused where it is a channel's only allowed group; else each channel it leaves is
    recorded as changed, and so is each member."""
    alone = channels_only_allowing([instance])
    if alone:
        raise ProtectedError(refusal(instance, alone), set(alone))
    removed_with(instance, Channel.objects.filter(allowed_groups=instance), "allowed_groups")
    removed_with(instance, User.objects.filter(groups=instance), "groups")
