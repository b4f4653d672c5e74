"""The team's own sign-in: LDAP against a real OpenLDAP server (slapd) and OpenID Connect
against a real provider process (oidc-provider-mock), each through Chromium, with directory
groups mapped to SlotServe groups and a staff group to staff. Local accounts keep working."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.test import Client

from tests import factories
from tests.clock import eventually
from tests.conftest import free_port
from tests.test_browser import CHROMIUM

SLAPD = shutil.which("slapd") or "/usr/sbin/slapd"
BASE = "dc=lab,dc=example"
pytestmark = pytest.mark.django_db(transaction=True)


def _wait_port(port: int, seconds: float = 15) -> None:
    def listening() -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    if not eventually(listening, timeout=seconds, every=0.1):
        raise RuntimeError(f"nothing listens on port {port}")


DIRECTORY = f"""dn: {BASE}
objectClass: dcObject
objectClass: organization
o: Lab
dc: lab

dn: ou=people,{BASE}
objectClass: organizationalUnit
ou: people

dn: ou=groups,{BASE}
objectClass: organizationalUnit
ou: groups

dn: uid=erin,ou=people,{BASE}
objectClass: inetOrgPerson
uid: erin
cn: Erin Example
givenName: Erin
sn: Example
mail: erin@lab.example
userPassword: erin-secret

dn: uid=finn,ou=people,{BASE}
objectClass: inetOrgPerson
uid: finn
cn: Finn Example
sn: Example
mail: finn@lab.example
userPassword: finn-secret

dn: cn=vision-lab,ou=groups,{BASE}
objectClass: groupOfNames
cn: vision-lab
member: uid=erin,ou=people,{BASE}
member: uid=finn,ou=people,{BASE}

dn: cn=gpu-admins,ou=groups,{BASE}
objectClass: groupOfNames
cn: gpu-admins
member: uid=erin,ou=people,{BASE}
"""


@pytest.fixture
def slapd(tmp_path: Path) -> Iterator[int]:
    """A throwaway OpenLDAP server with two people and two groups; its port."""
    if not (Path(SLAPD).exists() and shutil.which("slapadd")):
        pytest.skip("needs Debian's slapd (apt-get install slapd ldap-utils)")
    try:
        import django_auth_ldap  # noqa: F401
    except ImportError:
        pytest.skip("needs django-auth-ldap (pip install '.[ldap]'; Debian: libldap2-dev libsasl2-dev)")
    (tmp_path / "db").mkdir()
    config = tmp_path / "slapd.conf"
    config.write_text(
        "\n".join(
            [
                *(
                    f"include /etc/ldap/schema/{name}.schema"
                    for name in ("core", "cosine", "inetorgperson", "nis")
                ),
                "modulepath /usr/lib/ldap",
                "moduleload back_mdb",
                f"pidfile {tmp_path}/slapd.pid",
                "database mdb",
                f'suffix "{BASE}"',
                f'rootdn "cn=admin,{BASE}"',
                "rootpw admin-secret",
                f"directory {tmp_path}/db",
                "access to attrs=userPassword by anonymous auth by * none",
                "access to * by * read",
                "",
            ]
        )
    )
    (tmp_path / "lab.ldif").write_text(DIRECTORY)
    subprocess.run(
        ["slapadd", "-f", str(config), "-l", str(tmp_path / "lab.ldif")], check=True, capture_output=True
    )
    port = free_port()
    server = subprocess.Popen(
        [SLAPD, "-f", str(config), "-h", f"ldap://127.0.0.1:{port}/", "-d", "0"], stderr=subprocess.DEVNULL
    )
    try:
        _wait_port(port)
        yield port
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)


@pytest.fixture
def ldap_on(settings, slapd):
    from slotserve_site.sign_in_settings import ldap_settings

    for name, value in ldap_settings(
        url=f"ldap://127.0.0.1:{slapd}",
        bind_dn=f"cn=admin,{BASE}",
        bind_password="admin-secret",
        start_tls=False,
        user_base=f"ou=people,{BASE}",
        user_filter="(uid=%(user)s)",
        group_base=f"ou=groups,{BASE}",
        group_type="groupOfNames",
        staff_group=f"cn=gpu-admins,ou=groups,{BASE}",
    ).items():
        setattr(settings, name, value)
    settings.SLOTSERVE_LDAP_URL = f"ldap://127.0.0.1:{slapd}"
    settings.AUTHENTICATION_BACKENDS = [
        "axes.backends.AxesStandaloneBackend",
        "django_auth_ldap.backend.LDAPBackend",
        "django.contrib.auth.backends.ModelBackend",
    ]


def _browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.skip("needs Chromium (apt-get install chromium)")
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    return sync_playwright()


def _sign_in_form(page, url: str, username: str, password: str) -> None:
    page.goto(f"{url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")


def test_ldap_sign_in_in_chromium_maps_groups_and_staff(ldap_on, live_server):
    factories.user("local-lou")  # a local account keeps working
    with _browser() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = chromium.new_page()
        page.goto(f"{live_server.url}/accounts/login/")
        assert "(LDAP)" in page.inner_text("#sign-in-ldap")
        _sign_in_form(page, live_server.url, "erin", "erin-secret")
        page.wait_for_url(f"{live_server.url}/")
        erin = get_user_model().objects.get(username="erin")
        assert (erin.email, erin.first_name, erin.is_staff) == ("erin@lab.example", "Erin", True)
        assert sorted(erin.groups.values_list("name", flat=True)) == ["gpu-admins", "vision-lab"]
        other = chromium.new_page()
        _sign_in_form(other, live_server.url, "finn", "wrong")
        other.wait_for_selector(".errorlist")
        _sign_in_form(other, live_server.url, "finn", "finn-secret")
        other.wait_for_url(f"{live_server.url}/")
        finn = get_user_model().objects.get(username="finn")
        assert finn.is_staff is False and list(finn.groups.values_list("name", flat=True)) == ["vision-lab"]
        local = chromium.new_page()
        _sign_in_form(local, live_server.url, "local-lou", "pw-for-tests")
        local.wait_for_url(f"{live_server.url}/")
        chromium.close()


@pytest.fixture
def oidc_provider() -> Iterator[str]:
    """oidc-provider-mock in its own process, with one predefined user and their groups."""
    port = free_port()
    claims = {
        "sub": "gwen-sub",
        "preferred_username": "gwen",
        "email": "gwen@lab.example",
        "groups": ["nlp-lab", "gpu-admins"],
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "oidc_provider_mock",
            "--port",
            str(port),
            "--user-claims",
            json.dumps(claims),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)


def test_openid_connect_sign_in_in_chromium_maps_groups_and_staff(settings, oidc_provider, live_server):
    discovery = httpx.get(f"{oidc_provider}/.well-known/openid-configuration").json()
    settings.SLOTSERVE_OIDC_CLIENT_ID = "slotserve"
    settings.OIDC_RP_CLIENT_ID = "slotserve"
    settings.OIDC_RP_CLIENT_SECRET = "client-secret"
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = discovery["authorization_endpoint"]
    settings.OIDC_OP_TOKEN_ENDPOINT = discovery["token_endpoint"]
    settings.OIDC_OP_USER_ENDPOINT = discovery["userinfo_endpoint"]
    settings.OIDC_OP_JWKS_ENDPOINT = discovery["jwks_uri"]
    settings.SLOTSERVE_OIDC_NAME = "Lab SSO"
    settings.SLOTSERVE_OIDC_STAFF_GROUP = "gpu-admins"
    settings.AUTHENTICATION_BACKENDS = [
        "axes.backends.AxesStandaloneBackend",
        "django.contrib.auth.backends.ModelBackend",
        "portal.sign_in.DirectoryOIDCBackend",
    ]
    with _browser() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = chromium.new_page()
        page.goto(f"{live_server.url}/accounts/login/")
        page.click("#sign-in-oidc:has-text('Sign in with Lab SSO')")
        page.wait_for_url(f"{oidc_provider}/**")
        page.click("button[name=sub][value=gwen-sub]")  # the provider's own page: gwen signs in there
        page.wait_for_url(f"{live_server.url}/")
        gwen = get_user_model().objects.get(username="gwen")
        assert gwen.email == "gwen@lab.example" and gwen.is_staff is True
        assert sorted(gwen.groups.values_list("name", flat=True)) == ["gpu-admins", "nlp-lab"]
        assert "gwen" in page.inner_text("nav")
        chromium.close()


def test_without_settings_neither_method_is_offered(client, db):
    page = client.get("/accounts/login/").content.decode()
    assert "sign-in-oidc" not in page and "sign-in-ldap" not in page
    assert client.get("/oidc/authenticate/").status_code == 404


def test_oidc_settings_are_read_from_the_providers_discovery_document(oidc_provider):
    from io import StringIO

    from django.core.management import CommandError, call_command

    out = StringIO()
    call_command("oidc_settings", oidc_provider, stdout=out)
    lines = dict(line.split("=", 1) for line in out.getvalue().splitlines())
    assert lines["SLOTSERVE_OIDC_CLIENT_ID"] == "slotserve"
    assert lines["SLOTSERVE_OIDC_JWKS_ENDPOINT"] == f"{oidc_provider}/jwks"
    assert lines["SLOTSERVE_OIDC_AUTHORIZATION_ENDPOINT"].startswith(oidc_provider)
    with pytest.raises(CommandError, match="could not read"):
        call_command("oidc_settings", f"http://127.0.0.1:{free_port()}")


@pytest.mark.django_db
def test_the_password_reset_mail_links_to_the_public_address_whatever_the_host_header(settings, ana):
    settings.SLOTSERVE_PUBLIC_URL = "https://gpu.lab.example"
    settings.ALLOWED_HOSTS = ["*"]
    ana.email = "ana@lab.example"
    ana.save()
    Client().post("/accounts/password_reset/", {"email": ana.email}, HTTP_HOST="evil.example:8080")
    assert len(mail.outbox) == 1
    links = re.findall(r"https?://\S+", mail.outbox[0].body)
    assert links and all(link.startswith("https://gpu.lab.example/accounts/reset/") for link in links), links
    # SlotServe's own words, as its other mails: whose password, and what to do if not asked.
    assert mail.outbox[0].subject == "[SlotServe] Reset your password"
    assert "SlotServe password of ana" in mail.outbox[0].body and "ignore this mail" in mail.outbox[0].body


@pytest.mark.django_db
def test_the_password_reset_flow_is_linked_and_each_step_renders(db):
    client = Client()
    assert 'href="/accounts/password_reset/"' in client.get("/accounts/login/").content.decode()
    form = client.get("/accounts/password_reset/")
    assert form.status_code == 200 and "Send the link" in form.content.decode()
    sent = client.post("/accounts/password_reset/", {"email": "nobody@example.org"})
    assert sent.status_code == 302
    assert "Check your email" in client.get(sent["Location"]).content.decode()
    stale = client.get("/accounts/reset/MQ/set-password/")
    assert "used already or is too old" in stale.content.decode()
