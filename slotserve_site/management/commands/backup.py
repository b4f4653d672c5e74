"""``manage.py backup FILE``: a consistent copy of SlotServe's SQLite database, safe while it runs.

SlotServe keeps SQLite in WAL mode: the latest writes live in ``slotserve.sqlite3-wal`` until
SQLite folds them into the database file, so copying the file alone can miss them or catch it
half-written. This copies through SQLite's online backup, page by page, as one consistent
moment. On PostgreSQL the backup is the server's own (``pg_dump``); this says so.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection


class Command(BaseCommand):
    help = "Copy the SQLite database to FILE, consistently, while SlotServe runs (PostgreSQL: use pg_dump)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="the copy to write (a new file)")

    def handle(self, *args: Any, **options: Any) -> None:
        target = Path(options["file"]).expanduser().resolve()
        if connection.vendor != "sqlite":
            raise CommandError(
                f"the database is {connection.vendor}: back it up with the server's own tool, e.g. "
                'pg_dump --format=custom --file=slotserve.dump "$DATABASE_URL" (restore with pg_restore)'
            )
        if target.exists():
            raise CommandError(f"{target} exists already: give the backup a new name")
        if not target.parent.is_dir():
            raise CommandError(f"there is no folder {target.parent} to write {target.name} in")
        source = Path(connection.settings_dict["NAME"])
        partial = target.with_name(target.name + ".partial")
        try:
            with closing(sqlite3.connect(source)) as live, closing(sqlite3.connect(partial)) as copy:
                live.backup(copy)
            partial.rename(target)  # whole or not at all
        except sqlite3.Error as exc:
            partial.unlink(missing_ok=True)
            raise CommandError(f"could not copy {source}: {exc}") from None
        self.stdout.write(f"Copied {source} to {target} ({target.stat().st_size:,} bytes).")
