"""A process that outlives a PostgreSQL restart: its pooled connections are dead, and the
next request must not be the one that finds out (a lab's week under faults).

The restart is made real for the process's connections by ending them on the server
(``pg_terminate_backend``), which is what a restart does to them; the server itself stays up
for the rest of the suite. PostgreSQL only (the pool is PostgreSQL's)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    import sys
    import django

    django.setup()
    from django.db import connection

    def ask():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        connection.close()  # back to the pool, as at the end of a request

    ask()
    print("pooled", flush=True)
    sys.stdin.readline()  # the server ends the pool's connections meanwhile
    try:
        ask()
        print("answered")
    except Exception as exc:
        print("failed:", type(exc).__name__, exc)
    """
)


def test_the_first_query_after_a_database_restart_gets_a_live_connection(tmp_path):
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        pytest.skip("the connection pool is PostgreSQL's (run with DATABASE_URL=postgres://...)")
    name = f"restart_{os.getpid()}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            env = {**os.environ, "DATABASE_URL": url.rsplit("/", 1)[0] + f"/{name}", "PYTHONUNBUFFERED": "1"}
            env["DJANGO_SETTINGS_MODULE"] = "slotserve_site.settings"
            env["SLOTSERVE_DATA_DIR"] = str(tmp_path)
            process = subprocess.Popen(
                [sys.executable, "-c", SCRIPT],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert process.stdout is not None and process.stdin is not None
            assert process.stdout.readline().strip() == "pooled"
            ended = admin.execute(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()) AS ended",
                (name,),
            ).fetchone()
            assert ended is not None and ended[0] >= 1, "the pool kept a connection"
            out, _ = process.communicate("\n", timeout=60)
            assert out.strip() == "answered", out
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def restart_midway(monkeypatch):
    """The server ends the connection of the transaction that announces ``booking.approved``
    (the last thing a booking's transaction does), as a restart would, just before its webhooks'
    event is kept."""
    from django.db import connection

    from reservations.webhooks import listen

    if connection.vendor != "postgresql":
        pytest.skip("a server that ends connections: PostgreSQL (run with DATABASE_URL=postgres://...)")
    kept = listen.listening

    def restarted(happening):
        if happening.type == "booking.approved":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                (pid,) = cursor.fetchone()
            with psycopg.connect(_admin_url(), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        return kept(happening)

    monkeypatch.setattr(listen, "listening", restarted)


@pytest.mark.django_db(transaction=True)
def test_a_booking_whose_connection_the_server_ends_midway_is_never_reported_made(restart_midway):
    """The booking cannot be committed once its connection is gone, so it must not be returned
    as made. (Keeping the webhooks' event may fail and the booking stand, on a connection that
    goes on; a dead one takes the whole transaction with it.)"""
    from datetime import UTC, datetime, timedelta

    from django.db import DatabaseError

    from reservations.models import Reservation
    from reservations.services import NewBooking, reservation_create
    from tests import factories

    ana = factories.user("ana")
    target = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0")
    now = datetime(2026, 12, 7, 9, tzinfo=UTC)
    booking = NewBooking(
        user=ana, channel=channel, start=now + timedelta(hours=1), end=now + timedelta(hours=2),
        model=target.model, preset=target,
    )  # fmt: skip
    with pytest.raises(DatabaseError):
        reservation_create(booking, now=now)
    assert not Reservation.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_booking_asked_as_the_database_restarts_is_answered_503_and_is_not_made(restart_midway):
    """Through the REST API: a 503 with Retry-After that says what happened, not a 201 for a
    booking that is not there, nor a 500."""
    from datetime import timedelta

    from django.test import Client
    from django.utils import timezone

    from reservations.models import Reservation
    from tests import factories

    ana = factories.user("ana")
    target = factories.preset(factories.llm("qwen"), "chat")
    channel = factories.channel("a100-0")
    start = timezone.now().replace(microsecond=0) + timedelta(days=1)
    client = Client(raise_request_exception=False)
    client.force_login(ana)
    body = {
        "channel": channel.pk, "model": target.model.pk, "preset": target.pk,
        "start": factories.iso(start), "end": factories.iso(start + timedelta(hours=1)),
    }  # fmt: skip
    answer = client.post("/api/reservations/", body, content_type="application/json")
    assert answer.status_code == 503 and answer["Retry-After"] == "5", answer.content[:300]
    assert answer.json()["code"] == "database_unavailable"
    assert "database" in answer.json()["message"]
    assert not Reservation.objects.exists()


def _admin_url() -> str:
    """Another connection to the test's database, as its server's administrator would open."""
    from django.db import connection

    params = connection.get_connection_params()
    return psycopg.conninfo.make_conninfo(
        **{k: v for k, v in params.items() if k in {"host", "port", "user", "password", "dbname"}}
    )
