"""An approval is a review, not a decision (the scheduler's word): the fields say so.

On SQLite, renaming a foreign key remakes the table, and its triggers (migration 0005: no two
pending or approved reservations of a channel overlap) go with the old one: they are made again.
"""

import importlib

from django.db import migrations

_triggers = importlib.import_module("reservations.migrations.0005_sqlite_no_overlap_triggers")
_remake_triggers = _triggers._on_sqlite(_triggers.DROP + _triggers.CREATE)


class Migration(migrations.Migration):
    dependencies = [
        ("reservations", "0012_pending_index"),
    ]

    operations = [
        # Undone last: the triggers again after the table is remade with the old names.
        migrations.RunPython(migrations.RunPython.noop, _remake_triggers),
        migrations.RenameField(model_name="reservation", old_name="decided_by", new_name="reviewed_by"),
        migrations.RenameField(model_name="reservation", old_name="decided_at", new_name="reviewed_at"),
        migrations.RunPython(_remake_triggers, migrations.RunPython.noop),
    ]
