# An approval is a review, not a decision (the scheduler's word): the fields say so.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("reservations", "0012_pending_index"),
    ]

    operations = [
        migrations.RenameField(model_name="reservation", old_name="decided_by", new_name="reviewed_by"),
        migrations.RenameField(model_name="reservation", old_name="decided_at", new_name="reviewed_at"),
    ]
