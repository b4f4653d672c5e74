"""The project's own periodic task: the retention of the audit trail (``SLOTSERVE_AUDIT_DAYS``) and
of the channels' stories (``SLOTSERVE_STORY_DAYS``)."""

from __future__ import annotations

from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from slotserve_base import dispatch


def forget_old(now: datetime) -> int:
    """Drop the audit entries older than ``SLOTSERVE_AUDIT_DAYS`` and the story rows older than
    ``SLOTSERVE_STORY_DAYS``; how many went."""
    from auditlog.models import LogEntry

    from channels_app.models import StoryEntry

    gone, _ = LogEntry.objects.filter(
        timestamp__lt=now - timedelta(days=settings.SLOTSERVE_AUDIT_DAYS)
    ).delete()
    told, _ = StoryEntry.objects.filter(at__lt=now - timedelta(days=settings.SLOTSERVE_STORY_DAYS)).delete()
    return int(gone) + int(told)


@shared_task(name=dispatch.AUDIT_FORGET, ignore_result=True, soft_time_limit=30, time_limit=60)
def forget_old_audit() -> int:
    return forget_old(timezone.now())
