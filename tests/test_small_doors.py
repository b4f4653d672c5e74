"""The smaller doors of the guarantee's third round (docs/security.md): a form body in a charset
that makes lone surrogates, a tick that looks like a digit, the password-reset mail's address,
CSV cells for spreadsheets that split on ``;``."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from reservations.models import Reservation, ReservationStatus
from slotserve_base.csv_cells import SafeWriter
from tests import factories

pytestmark = pytest.mark.django_db

ESCAPING = "application/x-www-form-urlencoded; charset=unicode_escape"


@pytest.mark.parametrize("where", ["/api/keys/", "/api/webhooks/", "/api/reservations/", "/api/waitlist/"])
def test_a_form_body_in_a_charset_that_makes_lone_surrogates_is_refused_400_by_the_api(ana, where):
    factories.channel("a100-0")
    api = APIClient()
    api.force_authenticate(ana)
    answer = api.generic("POST", where, b"name=%5Cud800&url=%5Cud800&channel=a100-0", content_type=ESCAPING)
    assert answer.status_code == 400, answer.content
    assert "charset" in answer.json()["message"] and "UTF-8" in answer.json()["message"]


@pytest.mark.parametrize(
    "where", ["/book/", "/keys/", "/webhooks/", "/settings/", "/settings/time-zone", "/approvals/approve"]
)
def test_a_form_body_in_a_charset_that_makes_lone_surrogates_is_refused_400_by_the_portal(staff, where):
    browser = Client()
    browser.force_login(staff)
    answer = browser.generic("POST", where, b"name=%5Cud800&reservation=1", content_type=ESCAPING)
    assert answer.status_code == 400, (where, answer.status_code)
    assert b"UTF-8" in answer.content


def test_a_form_in_utf_8_still_goes_through(ana):
    browser = Client()
    browser.force_login(ana)
    for charset in ("utf-8", "UTF-8"):
        answer = browser.generic(
            "POST",
            "/settings/time-zone",
            b"time_zone=Europe%2FBerlin",
            content_type=f"application/x-www-form-urlencoded; charset={charset}",
        )
        assert answer.status_code in (200, 204, 302), (charset, answer.status_code)


def test_ticks_that_only_look_like_numbers_are_skipped_not_a_500(staff, ana):
    channel = factories.channel("a100-1", policy="all")
    start = timezone.now() + timedelta(days=1)
    asked = factories.reservation(
        owner=ana, on=channel, start=start, end=start + timedelta(hours=1), status=ReservationStatus.PENDING
    )
    browser = Client()
    browser.force_login(staff)
    answer = browser.post("/approvals/approve", {"reservation": ["²", "١", str(asked.pk)]})
    assert answer.status_code == 302
    assert Reservation.objects.get(pk=asked.pk).status == ReservationStatus.APPROVED


def test_the_password_reset_mail_links_to_the_public_address_whatever_the_host_header(settings, ana):
    settings.SLOTSERVE_PUBLIC_URL = "https://gpu.lab.example"
    settings.ALLOWED_HOSTS = ["*"]
    ana.email = "ana@lab.example"
    ana.save()
    Client().post("/accounts/password_reset/", {"email": ana.email}, HTTP_HOST="evil.example:8080")
    assert len(mail.outbox) == 1
    links = re.findall(r"https?://\S+", mail.outbox[0].body)
    assert links and all(link.startswith("https://gpu.lab.example/accounts/reset/") for link in links), links


def test_csv_cells_with_a_semicolon_are_quoted_for_spreadsheets_that_split_on_it():
    out = io.StringIO()
    SafeWriter(out).writerow(["x;=1+1", "plain", 3, "=SUM(A1)"])
    line = out.getvalue().strip()
    assert '"x;=1+1"' in line and "'=SUM(A1)" in line
    # A spreadsheet that splits on ";" keeps the cell whole (quoted), so its formula is text.
    cells = next(csv.reader(io.StringIO(line), delimiter=";"))
    assert not any(cell.startswith("=") for cell in cells), cells


def test_ports_squatted_by_another_local_user_are_named_in_the_error():
    import os
    import subprocess

    from channels_app.node_worker.processes import free_port

    if os.geteuid() != 0:
        pytest.skip("needs root, to act as another local user")
    ports = range(30950, 30954)
    squatter = subprocess.Popen(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            "import socket, time\n"
            f"held = [socket.create_server(('0.0.0.0', p)) for p in range({ports.start}, {ports.stop})]\n"
            "print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "ready"
        with pytest.raises(OSError, match="no free port") as refused:
            free_port("127.0.0.1", ports)
    finally:
        squatter.kill()
        squatter.wait()
    message = str(refused.value)
    assert "no free port on 127.0.0.1 in SLOTSERVE_PROCESS_PORTS (30950-30953)" in message
    assert "4 are listened on, by uid 65534 (4 of them, port 30950 first)" in message, message
    assert "Ports taken by another user" in message
