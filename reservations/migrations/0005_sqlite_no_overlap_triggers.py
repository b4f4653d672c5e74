"""No two pending or approved reservations of one channel overlap, on SQLite too.

PostgreSQL states the rule as the exclusion constraint ``reservation_no_overlap``;
SQLite has none, so two triggers abort any insert or update that would break it,
whatever code path writes the row (services, the admin, raw SQL).
"""

from django.db import migrations

# julianday() reads both Django's "YYYY-MM-DD HH:MM:SS[.ffffff]" and ISO "T" forms.
_OVERLAP = """
SELECT RAISE(ABORT, 'reservation_no_overlap: the slot overlaps another reservation of this channel')
WHERE NEW.status IN ('pending', 'approved') AND EXISTS (
    SELECT 1 FROM reservations_reservation AS other
    WHERE other.channel_id = NEW.channel_id
      AND other.id IS NOT NEW.id
      AND other.status IN ('pending', 'approved')
      AND julianday(other.start) < julianday(NEW."end")
      AND julianday(NEW.start) < julianday(other."end")
);
"""

CREATE = [
    f"CREATE TRIGGER reservation_no_overlap_insert BEFORE INSERT ON reservations_reservation "
    f"BEGIN {_OVERLAP} END;",
    f'CREATE TRIGGER reservation_no_overlap_update BEFORE UPDATE OF start, "end", status, channel_id '
    f"ON reservations_reservation BEGIN {_OVERLAP} END;",
]
DROP = [
    "DROP TRIGGER IF EXISTS reservation_no_overlap_insert;",
    "DROP TRIGGER IF EXISTS reservation_no_overlap_update;",
]


def _on_sqlite(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "sqlite":
            for statement in statements:
                schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [("reservations", "0004_reservation_extends")]

    operations = [migrations.RunPython(_on_sqlite(CREATE), _on_sqlite(DROP))]
