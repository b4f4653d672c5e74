"""Safe by default: private files, booking limits on every channel, sign-in throttling, no weak
secret key, one switch for HTTPS, constant-time metrics token, new keys never cached."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import Client
from django.utils import timezone

from reservations.models import Reservation
from slotserve_base.env import secret_key_weakness
from tests import factories
from tests.factories import iso

ROOT = Path(__file__).resolve().parent.parent


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.django_db
def test_data_directory_database_and_secret_key_are_private():
    data = Path(django_settings.DATA_DIR)
    assert _mode(data) == 0o700
    assert _mode(data / "secret_key") == 0o600
    if connection.vendor == "sqlite":
        connection.ensure_connection()
        database = Path(connection.settings_dict["NAME"])
        assert _mode(database) == 0o600
        wal = Path(f"{database}-wal")
        if wal.exists():
            assert _mode(wal) == 0o600


def _settings_in_a_new_process(
    env: dict[str, str], code: str, data_dir: Path
) -> subprocess.CompletedProcess[str]:
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SLOTSERVE_")},
        "SLOTSERVE_DATA_DIR": str(data_dir),
        "DJANGO_SETTINGS_MODULE": "slotserve_site.settings",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); from django.conf import settings; {code}"],
        env=environment,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_a_new_data_directory_is_created_private(tmp_path):
    os.umask(0o022)
    fresh = tmp_path / "fresh"
    done = _settings_in_a_new_process({}, "print(settings.DATA_DIR)", fresh)
    assert done.returncode == 0, done.stderr
    assert _mode(fresh) == 0o700 and _mode(fresh / "secret_key") == 0o600


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("changeme", "only 8 characters"),
        ("django-insecure-0123456789abcdefghijklmnopqrstuvwxyz", "placeholder"),
        ("change-me-to-a-long-random-string-please-0123", "placeholder"),
        ("a" * 64, "too few different characters"),
        ("x7Gq2LmN9pRt4VwZ8bKd3FhJ6sYc1AeU0oIu5lTe", ""),
    ],
)
def test_weak_secret_keys_are_named(key, why):
    assert (why in secret_key_weakness(key)) if why else secret_key_weakness(key) == ""


def test_a_weak_secret_key_stops_start_up_naming_the_variable(tmp_path):
    done = _settings_in_a_new_process({"SLOTSERVE_SECRET_KEY": "changeme"}, "print('started')", tmp_path)
    assert done.returncode != 0 and "started" not in done.stdout
    assert "SLOTSERVE_SECRET_KEY is only 8 characters long" in done.stderr


def test_the_log_level_is_read_in_any_case_and_an_unknown_one_stops_start_up(tmp_path):
    code = "import logging; print(settings.SLOTSERVE_LOG_LEVEL, logging.getLogger().level)"
    lower = _settings_in_a_new_process({"SLOTSERVE_LOG_LEVEL": "warning"}, code, tmp_path)
    assert lower.returncode == 0, lower.stderr
    assert lower.stdout.split() == ["WARNING", "30"]
    unknown = _settings_in_a_new_process({"SLOTSERVE_LOG_LEVEL": "loud"}, code, tmp_path)
    assert unknown.returncode != 0 and unknown.stdout == ""
    assert "SLOTSERVE_LOG_LEVEL='loud' is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL" in unknown.stderr


def test_the_public_address_is_kept_without_its_slash_and_a_wrong_one_stops_start_up(tmp_path):
    code = "print(settings.SLOTSERVE_PUBLIC_URL)"
    given = _settings_in_a_new_process({"SLOTSERVE_PUBLIC_URL": "https://gpu.lab.example/"}, code, tmp_path)
    assert given.returncode == 0 and given.stdout.strip() == "https://gpu.lab.example", given.stderr
    wrong = _settings_in_a_new_process({"SLOTSERVE_PUBLIC_URL": "gpu.lab.example"}, code, tmp_path)
    assert wrong.returncode != 0 and "SLOTSERVE_PUBLIC_URL='gpu.lab.example'" in wrong.stderr


def test_one_setting_turns_on_https_protections(tmp_path):
    code = (
        "print(settings.SESSION_COOKIE_SECURE, settings.CSRF_COOKIE_SECURE, settings.SECURE_HSTS_SECONDS, "
        "settings.SECURE_PROXY_SSL_HEADER, settings.SECURE_SSL_REDIRECT)"
    )
    on = _settings_in_a_new_process({"SLOTSERVE_HTTPS": "true"}, code, tmp_path)
    assert on.returncode == 0, on.stderr
    assert on.stdout.split(None, 3)[:3] == ["True", "True", "31536000"]
    assert "HTTP_X_FORWARDED_PROTO" in on.stdout and on.stdout.strip().endswith("True")
    off = _settings_in_a_new_process({}, code, tmp_path)
    assert off.stdout.split()[:3] == ["False", "False", "0"]


@pytest.mark.django_db
def test_channels_without_limits_get_the_default_longest_booking_and_horizon(ana_api):
    target = factories.preset(factories.llm("m"), "p")
    channel = factories.channel("open")
    assert channel.max_booking_minutes is None and channel.max_days_ahead is None
    start = timezone.now() + timedelta(hours=1)

    def book(begin, end):
        body = {"channel": channel.pk, "start": iso(begin), "end": iso(end), "model": target.model_id}
        return ana_api.post("/api/reservations/", body)

    far = book(start + timedelta(days=61), start + timedelta(days=61, hours=1))
    assert far.status_code == 400 and "at most 60 days ahead" in far.data["message"]
    very_far = book(start.replace(year=8999), start.replace(year=8999) + timedelta(hours=1))
    assert very_far.status_code == 400 and "days ahead" in very_far.data["message"]
    long = book(start, start + timedelta(hours=25))
    assert long.status_code == 400 and "at most 24 hours" in long.data["message"]
    assert book(start, start + timedelta(hours=24)).status_code == 201
    # A channel's own limit wins over the default.
    channel.max_booking_minutes = 48 * 60
    channel.save()
    later = start + timedelta(days=2)
    assert book(later, later + timedelta(hours=30)).status_code == 201
    assert Reservation.objects.count() == 2


@pytest.mark.django_db
def test_sign_in_locks_out_after_repeated_failures_per_user_and_address(ana, bo):
    for user in (ana, bo):
        user.set_password("right-password-1")
        user.save()
    client = Client(REMOTE_ADDR="10.9.8.7")
    for _ in range(django_settings.AXES_FAILURE_LIMIT - 1):
        wrong = client.post("/accounts/login/", {"username": "ana", "password": "wrong"})
        assert wrong.status_code == 200  # the form again
    last = client.post("/accounts/login/", {"username": "ana", "password": "wrong"})
    assert last.status_code == 429
    locked = client.post("/accounts/login/", {"username": "ana", "password": "right-password-1"})
    assert locked.status_code == 429 and "Signing in is paused" in locked.content.decode()
    # Another colleague at the same address, and the same account from elsewhere, still sign in.
    assert (
        client.post("/accounts/login/", {"username": "bo", "password": "right-password-1"}).status_code == 302
    )
    elsewhere = Client(REMOTE_ADDR="10.1.1.1")
    answer = elsewhere.post("/accounts/login/", {"username": "ana", "password": "right-password-1"})
    assert answer.status_code == 302


@pytest.mark.django_db
def test_metrics_token_and_the_new_key_page_is_never_cached(settings, ana):
    settings.SLOTSERVE_METRICS_TOKEN = "t0k3n-for-prometheus"
    client = Client()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer t0k3n-for-prometheus-no").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer t0k3n-for-prometheus").status_code == 200
    client.force_login(ana)
    page = client.post("/keys/", {"name": "laptop"})
    assert page.status_code == 200 and "no-store" in page["Cache-Control"]


@pytest.mark.django_db
def test_behind_a_trusted_proxy_the_lock_out_counts_the_address_it_forwards(ana, settings):
    """With SLOTSERVE_TRUSTED_PROXIES naming the proxy, its X-Forwarded-For is believed, from the
    right: the entry a caller could forge (the leftmost) counts for nothing."""
    settings.SLOTSERVE_TRUSTED_PROXIES = ["127.0.0.1", "10.0.0.0/8"]
    ana.set_password("right-password-1")
    ana.save()
    proxy = Client(REMOTE_ADDR="127.0.0.1")

    def sign_in(password: str, forwarded: str) -> int:
        answer = proxy.post(
            "/accounts/login/", {"username": "ana", "password": password}, HTTP_X_FORWARDED_FOR=forwarded
        )
        return answer.status_code

    for n in range(django_settings.AXES_FAILURE_LIMIT):
        # Each with another forged first entry; the proxies saw 198.51.100.4 call.
        sign_in("wrong", f"203.0.113.{n}, 198.51.100.4, 10.1.2.3")
    assert sign_in("right-password-1", "1.2.3.4, 198.51.100.4") == 429
    assert sign_in("right-password-1", "198.51.100.5") == 302  # a colleague elsewhere
    # Not from a trusted proxy: the header is nobody's word, the socket's address counts.
    direct = Client(REMOTE_ADDR="192.0.2.7")
    for _ in range(django_settings.AXES_FAILURE_LIMIT):
        direct.post(
            "/accounts/login/", {"username": "ana", "password": "wrong"}, HTTP_X_FORWARDED_FOR="198.51.100.9"
        )
    locked = direct.post(
        "/accounts/login/",
        {"username": "ana", "password": "right-password-1"},
        HTTP_X_FORWARDED_FOR="198.51.100.99",
    )
    assert locked.status_code == 429


def test_the_process_port_range_is_read_and_a_wrong_one_stops_start_up(tmp_path):
    code = "print(settings.SLOTSERVE_PROCESS_PORTS)"
    default = _settings_in_a_new_process({}, code, tmp_path)
    assert default.returncode == 0 and default.stdout.strip() == "range(31000, 32000)", default.stderr
    given = _settings_in_a_new_process({"SLOTSERVE_PROCESS_PORTS": "5800-5899"}, code, tmp_path)
    assert given.stdout.strip() == "range(5800, 5900)", given.stderr
    kernel = _settings_in_a_new_process({"SLOTSERVE_PROCESS_PORTS": "any"}, code, tmp_path)
    assert kernel.stdout.strip() == "None", kernel.stderr
    for wrong, why in [
        ("31000:31999", "write a range of ports, e.g. 31000-31999, or any"),
        ("5900-5800", "the first port is above the last"),
        ("80-90", "ports must be 1024 or more"),
        ("60000-70000", "ports must be 65535 or less"),
    ]:
        done = _settings_in_a_new_process({"SLOTSERVE_PROCESS_PORTS": wrong}, code, tmp_path)
        assert done.returncode != 0, wrong
        assert f"SLOTSERVE_PROCESS_PORTS={wrong!r}: {why}" in done.stderr
