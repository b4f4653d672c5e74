"""The audit trail's one helper for writes that bypass model signals (docs/architecture.md, "The
audit trail"): a service that changes rows with ``QuerySet.update`` records the change itself."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Model


def audited(instance: Model, before: dict[str, Any], after: dict[str, Any]) -> None:
    """Record that ``instance`` changed from ``before`` to ``after`` (only the fields that
    differ), with whoever and whatever the request or command is (the audit middleware)."""
    from auditlog.models import LogEntry

    changes = {
        name: [_text(before.get(name)), _text(value)]
        for name, value in after.items()
        if _text(before.get(name)) != _text(value)
    }
    if changes:
        LogEntry.objects.log_create(instance, action=LogEntry.Action.UPDATE, changes=changes, force_log=True)


def _text(value: Any) -> str:
    """As django-auditlog writes a value: ``None`` as "None", others as ``str``."""
    return "None" if value is None else str(value)


def removed_with(deleted: Model, owners: Iterable[Model], name: str) -> None:
    """``deleted`` goes, and with it its place in each owner's many-to-many field ``name`` (a
    deletion removes such rows without a signal): recorded on each owner, as a removal."""
    from auditlog.models import LogEntry

    for owner in owners:
        LogEntry.objects.log_m2m_changes([deleted], owner, "delete", name)
