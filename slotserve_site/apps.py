from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.apps import AppConfig
from django.db.backends.signals import connection_created


def _private_sqlite_files(sender: Any, connection: Any, **kwargs: Any) -> None:
    """The SQLite database holds the sessions: readable by SlotServe's user only (0600),
    with its write-ahead log and shared-memory files, whatever the umask made them."""
    if connection.vendor != "sqlite":
        return
    name = str(connection.settings_dict["NAME"])
    if not name or name == ":memory:" or name.startswith("file:"):
        return
    for path in (Path(name), Path(f"{name}-wal"), Path(f"{name}-shm")):
        if path.exists() and path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)


class SlotServeSiteConfig(AppConfig):
    name = "slotserve_site"
    verbose_name = "SlotServe"

    def ready(self) -> None:
        from slotserve_base.iso import use_utc_moments

        connection_created.connect(_private_sqlite_files, dispatch_uid="slotserve-private-sqlite")
        use_utc_moments()  # every API moment in UTC (docs/api.md)
        from slotserve_site.audit import register_audited

        register_audited()  # the audit trail's models (docs/architecture.md)
