"""The project's own periodic task: the audit trail's retention (``SLOTSERVE_AUDIT_DAYS``)."""

from __future__ import annotations

from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from slotserve_base import dispatch


def forget_old(now: datetime) -> int:
    """Drop the audit entries older than ``SLOTSERVE_AUDIT_DAYS``; how many went."""
    from auditlog.models import LogEntry

    gone, _ = LogEntry.objects.filter(
        timestamp__lt=now - timedelta(days=settings.SLOTSERVE_AUDIT_DAYS)
    ).delete()
    return int(gone)


@shared_task(name=dispatch.AUDIT_FORGET, ignore_result=True, soft_time_limit=30, time_limit=60)
def forget_old_audit() -> int:
    return forget_old(timezone.now())
