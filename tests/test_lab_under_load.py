"""A lab at once: the one-command start against PostgreSQL, with 50 colleagues' clients calling
the REST API together, answers every request and holds no more database connections than its
pools allow."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from datetime import timedelta

import httpx
import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from gateway.api_keys import api_key_create
from tests import factories
from tests.conftest import free_port
from tests.test_one_command_start import _run_env, healthy, log_text, start_run

pytestmark = pytest.mark.django_db(transaction=True)

CLIENTS, EACH, POOL = 50, 12, 4


def _database_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def _connections(database: str, admin: psycopg.Connection) -> int:
    row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [database]).fetchone()
    return int(row[0]) if row else 0


def test_fifty_clients_at_once_get_answers_and_the_connections_stay_within_the_pools(tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("database connections run out on PostgreSQL (run with DATABASE_URL=postgres://...)")
    channel = factories.channel("a100-0")
    keys = []
    for n in range(10):
        person = factories.user(f"colleague{n}")
        start = timezone.now() + timedelta(days=1, hours=2 * n)
        factories.reservation(owner=person, on=channel, start=start, end=start + timedelta(hours=1))
        keys.append(api_key_create(user=person, name="load")[1])
    port = free_port()
    env = {
        **_run_env(tmp_path, port),
        "DATABASE_URL": _database_url(),
        "SLOTSERVE_DB_POOL_SIZE": str(POOL),
    }
    run = start_run(tmp_path, env, "--no-node", "--port", str(port))
    base = f"http://127.0.0.1:{port}"
    statuses: Counter[int] = Counter()
    peak = [0]
    done = threading.Event()
    database = connection.settings_dict["NAME"]
    try:
        assert healthy(base, time.monotonic() + 90), log_text(tmp_path)[-3000:]
        admin_db = connection.settings_dict
        with psycopg.connect(
            host=admin_db["HOST"] or "127.0.0.1",
            port=admin_db["PORT"] or 5432,
            user=admin_db["USER"],
            dbname="postgres",
            autocommit=True,
        ) as admin:

            def watch() -> None:
                while not done.is_set():
                    peak[0] = max(peak[0], _connections(database, admin))
                    time.sleep(0.05)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()

            def colleague(n: int) -> None:
                headers = {"Authorization": f"Bearer {keys[n % len(keys)]}"}
                with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
                    for i in range(EACH):
                        path = ("/api/channels/", "/api/reservations/", "/api/notifications/")[i % 3]
                        try:
                            statuses[client.get(path).status_code] += 1
                        except httpx.HTTPError:
                            statuses[0] += 1

            clients = [threading.Thread(target=colleague, args=(n,)) for n in range(CLIENTS)]
            for client in clients:
                client.start()
            for client in clients:
                client.join()
            done.set()
            watcher.join()
    finally:
        done.set()
        os.killpg(run.pid, signal.SIGINT)
        run.wait(timeout=60)
    assert statuses == Counter({200: CLIENTS * EACH}), (statuses, log_text(tmp_path)[-3000:])
    # A pool each for the processes that may connect (run itself, the web server, the Celery
    # worker with beat and its two children) and this test's own two: a colleague more does
    # not cost a connection more (without the pools, 50 clients ran PostgreSQL out).
    assert peak[0] <= 5 * POOL + 2, peak[0]


@pytest.mark.parametrize("path", ["/", "/api/channels/"])
def test_a_pool_with_no_connection_in_time_answers_503_with_retry_after(path, staff, monkeypatch):
    """Overloaded, SlotServe says so (503, Retry-After) instead of failing (500)."""
    from django.db import OperationalError
    from django.test import Client
    from psycopg_pool import PoolTimeout

    def busy(*args, **kwargs):
        try:
            raise PoolTimeout("couldn't get a connection after 20.00 sec")
        except PoolTimeout as exc:
            raise OperationalError(str(exc)) from exc

    monkeypatch.setattr("portal.views.channel_cards", busy)
    monkeypatch.setattr("channels_app.api.views.ChannelViewSet.get_queryset", busy)
    client = Client(raise_request_exception=False)
    client.force_login(staff)
    answer = client.get(path)
    assert answer.status_code == 503 and answer["Retry-After"] == "5", answer.content[:300]
    if path.startswith("/api/"):
        assert answer.json()["code"] == "busy"
    # Any other failure is still the 500 it is.
    monkeypatch.setattr("portal.views.channel_cards", lambda **kwargs: 1 / 0)
    assert client.get("/").status_code == 500
