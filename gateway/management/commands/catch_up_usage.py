"""``manage.py catch_up_usage``: fold the request log's backlog into the roll-ups now, with progress."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from gateway.usage.rollups import catch_up, roll_up


class Command(BaseCommand):
    help = (
        "Fold the request log's rows that usage has not counted yet (a restore, an import) into its "
        "roll-ups, in hour order, printing the progress: what the background task does, at once."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        roll_up()  # sets a mass of rows aside as the backlog; folds a few at once
        while True:
            caught = catch_up(seconds=5)
            if caught.finished:
                break
            self.stdout.write(
                f"{caught.done:,} of {caught.rows:,} rows ({100 * caught.done // max(caught.rows, 1)} %)"
            )
        self.stdout.write(f"usage is up to date ({caught.rows:,} rows of backlog folded)")
