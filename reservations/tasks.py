"""Side effects of reservations, as Celery tasks: reminders, and notification emails that
retry while the mail server is away instead of stalling whoever committed the change."""

from __future__ import annotations

import smtplib

from celery import shared_task
from django.core.mail import send_mail
from django.utils import timezone

from reservations.idle import apply_idle_rule
from reservations.reminders import send_starting_soon
from slotserve_base import dispatch


@shared_task(name=dispatch.STARTING_SOON, ignore_result=True, soft_time_limit=30, time_limit=60)
def send_starting_soon_reminders() -> int:
    """Tell bookers whose reservation starts within 15 minutes (once each)."""
    return send_starting_soon(now=timezone.now())


@shared_task(name=dispatch.IDLE_RULE, ignore_result=True, soft_time_limit=30, time_limit=60)
def release_idle_bookings() -> dict[str, int]:
    """Warn bookers whose booking no request reached, and release those still unused (the
    channel's idle rule)."""
    return apply_idle_rule(now=timezone.now())


@shared_task(
    name=dispatch.NOTIFICATION_EMAIL,
    ignore_result=True,
    autoretry_for=(OSError, smtplib.SMTPException),
    retry_backoff=30,
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=8,
    soft_time_limit=60,
    time_limit=90,
)
def send_notification_email(address: str, subject: str, body: str) -> None:
    """Send one notification email; a mail server that is down is tried again, later and later."""
    send_mail(subject, body, None, [address])
