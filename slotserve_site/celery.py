"""The Celery application: beat runs the scheduler tick, node workers manage processes."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "slotserve_site.settings")

app = Celery("slotserve")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# The stages of channels_app keep their tasks in their own packages.
app.autodiscover_tasks(["channels_app.scheduling", "channels_app.node_agent"])
