"""``manage.py backup``: a consistent copy of the SQLite database while SlotServe runs (the
database is in WAL mode, so copying its file alone can miss the latest writes), which a new data
directory starts from; on PostgreSQL it says to use pg_dump."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from reservations.models import Reservation
from tests import factories

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.django_db(transaction=True)
def test_a_backup_holds_the_latest_writes_and_a_new_data_directory_starts_from_it(tmp_path):
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite backup (PostgreSQL: pg_dump, tested below)")
    start = timezone.now() + timedelta(hours=1)
    booked = factories.reservation(
        owner=factories.user(), on=factories.channel(), start=start, end=start + timedelta(hours=1)
    )
    Reservation.objects.filter(pk=booked.pk).update(note="kept by the backup")
    copy = tmp_path / "slotserve-backup.sqlite3"
    call_command("backup", str(copy))
    # Restore as the docs say: the copy becomes a new data directory's database.
    data = tmp_path / "restored"
    data.mkdir()
    copy.rename(data / "slotserve.sqlite3")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["SLOTSERVE_DATA_DIR"] = str(data)
    read = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-v",
            "0",
            "-c",
            "from reservations.models import Reservation; "
            "print(list(Reservation.objects.values_list('pk', 'note')))",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == str([(booked.pk, "kept by the backup")])


@pytest.mark.django_db
def test_a_backup_never_overwrites_a_file(tmp_path):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only")
    existing = tmp_path / "old.sqlite3"
    existing.write_text("an older backup")
    with pytest.raises(CommandError, match=f"{existing} exists already"):
        call_command("backup", str(existing))
    assert existing.read_text() == "an older backup"
    with pytest.raises(CommandError, match="no folder"):
        call_command("backup", str(tmp_path / "missing" / "new.sqlite3"))


@pytest.mark.django_db
def test_on_postgresql_the_backup_is_pg_dumps(tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    with pytest.raises(CommandError, match="pg_dump"):
        call_command("backup", str(tmp_path / "slotserve.sqlite3"))
    assert not (tmp_path / "slotserve.sqlite3").exists()
