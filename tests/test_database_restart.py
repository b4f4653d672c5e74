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
