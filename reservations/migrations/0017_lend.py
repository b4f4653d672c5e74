"""A booker may lend their slot while idle (docs/gateway.md, "Lending"); never a whole card.

On SQLite, adding the constraint remakes the table, and its triggers (migration 0005: no two
pending or approved reservations of a channel overlap) go with the old one: they are made again.
"""

import importlib

from django.db import migrations, models

_triggers = importlib.import_module("reservations.migrations.0005_sqlite_no_overlap_triggers")
_remake_triggers = _triggers._on_sqlite(_triggers.DROP + _triggers.CREATE)


class Migration(migrations.Migration):
    dependencies = [
        ("channels_app", "0022_lend_while_idle"),
        ("reservations", "0016_webhook_paused_event"),
    ]

    operations = [
        # Undone last: the triggers again after the table is remade without the field.
        migrations.RunPython(migrations.RunPython.noop, _remake_triggers),
        migrations.AddField(
            model_name="reservation",
            name="lend",
            field=models.BooleanField(
                default=False,
                db_default=False,
                help_text="Others may call the booked model while the booker is idle (where the channel lends).",
            ),
        ),
        migrations.AddConstraint(
            model_name="reservation",
            constraint=models.CheckConstraint(
                condition=models.Q(("exclusive", False), ("lend", False), _connector="OR"),
                name="reservation_no_whole_card_lent",
            ),
        ),
        migrations.RunPython(_remake_triggers, migrations.RunPython.noop),
    ]
