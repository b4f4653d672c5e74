"""The one-command start: it starts, serves, streams a completion in demo mode, and stops cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from gateway.models import ApiKey
from tests import factories
from tests.clock import eventually
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent


def processes_of(data_dir: Path) -> list[int]:
    """Live processes started for this SlotServe (their environment names its data directory)."""
    marker = f"SLOTSERVE_DATA_DIR={data_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def log_text(data_dir: Path) -> str:
    return (data_dir / "run.log").read_text()


def healthy(base: str, deadline: float) -> bool:
    """Whether the web server at ``base`` answers its health check before ``deadline``."""

    def answers() -> bool:
        try:
            return httpx.get(f"{base}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    return eventually(answers, timeout=max(deadline - time.monotonic(), 0), every=0.2)


def _is_part(pid: int, parent: int, flag: bytes) -> bool:
    """Whether ``pid`` is a part that ``manage.py run`` (``parent``) started, with ``flag`` in its command."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return int(stat[1]) == parent and flag in cmdline


def test_restart_pause_grows_while_a_part_keeps_dying_and_resets_after_a_steady_run():
    from slotserve_site.management.commands.run import RESTART_PAUSES, STEADY_SECONDS, _restart_pause

    assert [_restart_pause(deaths, ran=0.5) for deaths in range(7)] == [1.0, 2.0, 5.0, 10.0, 30.0, 30.0, 30.0]
    assert _restart_pause(4, ran=STEADY_SECONDS) == RESTART_PAUSES[0]


def try_line(data_dir: Path) -> str | None:
    """The shell line the demo printed to try its model, once it has."""
    lines = log_text(data_dir).splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("The demo model answers.")]
    return lines[said[-1] + 1].strip() if said and len(lines) > said[-1] + 1 else None


def python_without_openai(tmp_path: Path) -> Path:
    """A folder whose ``python`` is the system's, without the ``openai`` library."""
    folder = tmp_path / "plain-bin"
    folder.mkdir(exist_ok=True)
    plain = Path("/usr/bin/python3")
    (folder / "python").symlink_to(plain)
    assert subprocess.run([folder / "python", "-c", "import openai"], capture_output=True).returncode != 0
    return folder


def test_one_command_start_demo_and_clean_stop(tmp_path, llama_server_bin):
    import openai

    port = free_port()
    env = {
        **_run_env(tmp_path, port),
        "SLOTSERVE_LLAMA_SERVER": llama_server_bin,
        "SLOTSERVE_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.1",  # the test's receiver
    }
    run = start_run(tmp_path, env, "--port", str(port), "--demo")
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120

        def key_shown() -> str | None:
            text = (tmp_path / "run.log").read_text()
            assert run.poll() is None, text[-3000:]
            shown = [line for line in text.splitlines() if "API key for admin: " in line]
            return shown[-1].rsplit(": ", 1)[1].strip() if shown else None

        assert eventually(key_shown, timeout=120, every=0.2), (tmp_path / "run.log").read_text()[-3000:]
        key = key_shown()
        # The line to try it comes once the model answers, and runs as printed, the moment it
        # appears, in a shell whose ``python`` has no ``openai``: it streams.
        assert eventually(lambda: try_line(tmp_path), timeout=120, every=0.1), log_text(tmp_path)[-3000:]
        printed = try_line(tmp_path)
        assert printed is not None
        tried = subprocess.run(
            ["bash", "-c", printed],
            env={**os.environ, "PATH": f"{python_without_openai(tmp_path)}:{os.environ['PATH']}"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert tried.returncode == 0, tried.stderr[-2000:]
        assert len(tried.stdout.strip()) >= 2, tried.stdout  # a piece at a time
        assert healthy(base, deadline), log_text(tmp_path)[-3000:]
        assert httpx.get(f"{base}/accounts/login/").status_code == 200
        # The scheduler and the node worker bring the demo model up on its fake GPU.
        listed: list[str] = []

        def tiny_listed() -> bool:
            answer = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"})
            listed[:] = [m["id"] for m in answer.json()["data"]] if answer.status_code == 200 else []
            return "tiny" in listed

        assert eventually(tiny_listed, timeout=max(deadline - time.monotonic(), 0), every=0.5)
        assert "tiny" in listed, (tmp_path / "run.log").read_text()[-3000:]
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key)
        chunks = list(
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True, max_tokens=6
            )
        )
        # A whole stream, to its finish (a random tiny model's few tokens may all be parts of
        # characters, with no text of their own yet).
        assert any(c.choices and c.choices[0].finish_reason in ("length", "stop") for c in chunks), chunks
        # redis, uvicorn, scheduler, node worker, llama-server
        assert len(processes_of(tmp_path)) >= 5, log_text(tmp_path)[-3000:]

        # A webhook hears of a booking through the real Celery worker, signed.
        from standardwebhooks.webhooks import Webhook as Verifier

        from tests.receiver import Receiver

        api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"})
        with Receiver() as receiver:
            made = api.post("/api/webhooks/", json={"url": receiver.url, "events": ["booking.approved"]})
            assert made.status_code == 201, made.text
            start = (datetime.now(UTC) + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
            booked = api.post(
                "/api/reservations/",
                json={
                    "channel": "demo-0",
                    "model": "tiny",
                    "start": start.isoformat(),
                    "end": (start + timedelta(hours=1)).isoformat(),
                },
            )
            assert booked.status_code == 201, booked.text
            assert eventually(lambda: receiver.received, timeout=30, every=0.2), log_text(tmp_path)[-3000:]
        event = Verifier(made.json()["secret"]).verify(
            receiver.received[0].body, receiver.received[0].headers
        )
        assert event["type"] == "booking.approved" and event["data"]["booking"]["id"] == booked.json()["id"]

        # The terminal tells what happens, not each run of the tasks that run every few seconds
        # (those lines show with SLOTSERVE_LOG_LEVEL=DEBUG). By now the tick, the node's tick
        # and a reconcile have run, on both workers, which say they are ready.
        text = log_text(tmp_path)
        assert text.count(" ready.") >= 2, text[-3000:]
        assert "processes on ports 31000-31999" in text  # the node worker says where to firewall
        assert f"Emails link to {base}/ ;" in text  # no SLOTSERVE_PUBLIC_URL: the address it serves
        routine = [
            line
            for line in text.splitlines()
            if "succeeded in" in line or "Sending due task" in line or "] received" in line
        ]
        assert routine == [], routine[:5]
        assert "[config]" not in text and "[queues]" not in text  # no Celery banners
        # What a person needs comes last and plainly: where to sign in, then the line to try.
        running, ready = text.index("SlotServe is running on"), text.index("Ready. Sign in at ")
        assert running < ready < text.index("The demo model answers.")
        assert "with the password " in text[ready:].splitlines()[0]

        # A part that dies is started again; the model keeps serving meanwhile.
        scheduler = next(pid for pid in processes_of(tmp_path) if _is_part(pid, run.pid, b"--beat"))
        os.kill(scheduler, signal.SIGKILL)
        assert client.models.list().data[0].id == "tiny"
        assert eventually(lambda: "scheduler started again" in log_text(tmp_path), timeout=60, every=0.2)
        assert "scheduler exited with status -9; starting it again in 1 s" in log_text(tmp_path)
        assert "scheduler started again" in log_text(tmp_path)
        assert run.poll() is None, log_text(tmp_path)[-3000:]
    finally:
        os.killpg(run.pid, signal.SIGINT)
        code = run.wait(timeout=60)
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
    text = (tmp_path / "run.log").read_text()
    assert "Stopped 1 inference process(es)." in text and "SlotServe stopped." in text, text[-3000:]
    assert eventually(lambda: not processes_of(tmp_path), timeout=10, every=0.2)
    assert processes_of(tmp_path) == []


def start_run(log_dir: Path, env: dict[str, str], *argv: str) -> subprocess.Popen[bytes]:
    """``manage.py run ARGV`` in its own session, its output in ``log_dir/run.log`` (``log_text``)."""
    log = (log_dir / "run.log").open("w+")
    return subprocess.Popen(
        [sys.executable, "manage.py", "run", *argv],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _run_env(data_dir: Path, port: int) -> dict[str, str]:
    """``manage.py run``'s environment: its own data directory and node, an embedded Redis."""
    env = {k: v for k, v in os.environ.items() if k not in {"SLOTSERVE_REDIS_URL", "DATABASE_URL"}}
    env.update(SLOTSERVE_DATA_DIR=str(data_dir), SLOTSERVE_NODE_NAME=f"smoke-{port}", PYTHONUNBUFFERED="1")
    return env


def _run_briefly(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``manage.py run`` expected to stop by itself (stopped, with what it started, if it does not)."""
    started = subprocess.Popen(
        [sys.executable, "manage.py", "run", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = started.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        started.send_signal(signal.SIGINT)  # it stops what it started
        out, err = started.communicate(timeout=60)
        raise AssertionError(
            f"manage.py run {' '.join(argv)} went on running:\n{out[-2000:]}{err[-2000:]}"
        ) from None
    return subprocess.CompletedProcess(started.args, started.returncode, out, err)


def test_a_second_start_in_the_same_data_directory_stops_at_once_and_leaves_the_first_alone(tmp_path):
    port = free_port()
    env = _run_env(tmp_path, port)
    first = subprocess.Popen(
        [sys.executable, "manage.py", "run", "--port", str(port), "--no-node"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert healthy(f"http://127.0.0.1:{port}", time.monotonic() + 60)
        # Another port, so that only the data directory is shared: a second node worker and
        # scheduler on the same database would manage the same processes twice.
        second = _run_briefly(["--port", str(free_port())], env)
        assert second.returncode != 0
        assert f"SlotServe is already running from {tmp_path} (pid {first.pid})" in second.stderr
        assert "SlotServe is running on" not in second.stdout
        assert first.poll() is None
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    finally:
        os.killpg(first.pid, signal.SIGINT)
        first.wait(timeout=60)


def test_a_start_on_a_port_in_use_stops_at_once_naming_it(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _run_briefly(["--port", str(port), "--no-node"], _run_env(tmp_path, port))
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "--port" in done.stderr
    assert "SlotServe is running on" not in done.stdout
    assert processes_of(tmp_path) == []  # no embedded Redis or other part left behind


def test_the_embedded_redis_is_started_again_when_it_dies(tmp_path):
    """kill -9 of the embedded redis-server: ``run`` starts it again on the same socket with the
    same password, so every part finds it again without a restart of the whole."""
    port = free_port()
    run = start_run(tmp_path, _run_env(tmp_path, port), "--port", str(port), "--no-node")
    base = f"http://127.0.0.1:{port}"
    try:
        assert healthy(base, time.monotonic() + 60), log_text(tmp_path)[-3000:]
        servers = _redis_servers(run.pid)
        assert len(servers) == 1, log_text(tmp_path)[-3000:]
        os.kill(servers[0], signal.SIGKILL)
        assert eventually(lambda: "redis started again" in log_text(tmp_path), timeout=30, every=0.2)
        assert "redis exited with status -9; starting it again in 1 s" in log_text(tmp_path)
        assert healthy(base, time.monotonic() + 30), log_text(tmp_path)[-3000:]
        again = _redis_servers(run.pid)
        assert len(again) == 1 and again != servers
        assert run.poll() is None, log_text(tmp_path)[-3000:]
    finally:
        os.killpg(run.pid, signal.SIGINT)
        run.wait(timeout=60)
    assert not _redis_servers(run.pid), "stopped with the rest"


def _redis_servers(parent: int) -> list[int]:
    """The live redis-server processes ``parent`` started (Redis writes its title over its
    command line and environment, so they are found by parent and name)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == parent and stat[0] != "Z" and b"redis-server" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.django_db(transaction=True)
def test_the_one_command_start_links_emails_to_the_address_it_serves_unless_told_another(monkeypatch):
    from slotserve_site.running.parts import default_public_url

    assert default_public_url("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    assert default_public_url("::1", 8080) == "http://[::1]:8080"
    everywhere = default_public_url("0.0.0.0", 8000)
    assert everywhere.startswith("http://") and "0.0.0.0" not in everywhere  # the machine's name


@pytest.mark.django_db(transaction=True)
def test_each_start_of_the_demo_does_not_make_another_key():
    from slotserve_site.running.demo import demo_key

    admin = factories.user("admin", staff=True)
    first = demo_key(admin)
    assert first is not None and ApiKey.objects.filter(user=admin).count() == 1
    assert demo_key(admin) is None  # said at the first start; not made again
    assert ApiKey.objects.filter(user=admin).count() == 1


def test_start_help_names_its_defaults():
    said = subprocess.run(
        [sys.executable, "manage.py", "run", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert said.returncode == 0, said.stderr
    words = " ".join(said.stdout.split())  # argparse wraps its lines
    assert "(default: 127.0.0.1" in words and "(default: 8000)" in words and "(default: admin)" in words


def test_the_web_server_keeps_an_idle_connection_longer_than_a_persons_pause(tmp_path):
    """A colleague reads a page for a while, then clicks: their browser (or script) sends the next
    request on the connection it kept. The web part ``run`` starts must not be closing that
    connection meanwhile (uvicorn's own 5 s would: a client reusing it as it closes sees its
    connection reset), nor behind a load balancer that keeps idle connections for 60 s."""
    import http.client

    from slotserve_site.running.parts import web_command, web_options

    port = free_port()
    assert web_options()["timeout_keep_alive"] > 60
    argv = web_command(host="127.0.0.1", port=port)
    env = {**_run_env(tmp_path, port), "SLOTSERVE_WEB_PROCESSES": "1"}
    web = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert eventually(lambda: _answers(port), timeout=30, every=0.2), "the web part did not start"
        browser = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for pause in (0, 7):  # past uvicorn's default of 5 s
            time.sleep(pause)
            # On the connection kept from the last answer: http.client opens none anew for one
            # the server closed meanwhile, it fails (RemoteDisconnected).
            browser.request("GET", "/static/portal/slotserve.svg")
            answer = browser.getresponse()
            assert answer.status == 200 and answer.read().startswith(b"<svg"), f"after {pause} s idle"
        browser.close()
    finally:
        web.terminate()
        web.wait(timeout=20)


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/static/portal/slotserve.svg", timeout=2).status_code > 0
    except httpx.HTTPError:
        return False


def test_a_web_process_is_ready_before_its_first_request(tmp_path):
    """Loading the web application (what each web process does at start) imports every view,
    compiles every template of the project and fills the URLconf's reverse look-ups (each
    resolver's, done at the first ``reverse`` of it: 183 ms of the first overview a process
    answered at a lab of a thousand): the first page anyone opens after a start is not the one
    that pays for them."""
    script = (
        "import sys, json, slotserve_site.asgi\n"
        "from django.template import engines\n"
        "from django.urls import URLResolver, get_resolver\n"
        "cached = engines['django'].engine.template_loaders[0].get_template_cache\n"
        "api = any(m.startswith('reservations.api') for m in sys.modules)\n"
        "views = 'portal.views' in sys.modules\n"
        "def walk(r):\n"
        "    yield r\n"
        "    for p in r.url_patterns:\n"
        "        if isinstance(p, URLResolver):\n"
        "            yield from walk(p)\n"
        "empty = [str(r.pattern) for r in walk(get_resolver()) if not r._populated]\n"
        "import django.urls.resolvers as resolvers\n"
        "from django.urls import reverse\n"
        "filling = resolvers.URLResolver._populate\n"
        "def told(self):\n"
        "    empty.append(str(self.pattern))\n"
        "    return filling(self)\n"
        "resolvers.URLResolver._populate = told\n"
        "for name in ('portal:overview', 'admin:index', 'rest_framework:login', 'audit'):\n"
        "    reverse(name)\n"
        "print(json.dumps({'templates': sorted(cached), 'views': views, 'api': api, 'empty': empty}))\n"
    )
    env = {**_run_env(tmp_path, free_port()), "DJANGO_SETTINGS_MODULE": "slotserve_site.settings"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    project = sorted(
        p.relative_to(ROOT / "templates").as_posix() for p in (ROOT / "templates").rglob("*.html")
    )
    assert set(project) <= set(loaded["templates"]), set(project) - set(loaded["templates"])
    assert loaded["views"] and loaded["api"]
    assert loaded["empty"] == []  # a private flag of Django's: whether a resolver was filled


def test_a_killed_web_process_costs_no_request_and_one_sent_while_all_are_down_waits(tmp_path):
    """kill -9 of a process of the web part (a crash, the kernel's out-of-memory killer): the
    others go on answering while ``run`` starts it again. With every one of them down at once, a
    connection made meanwhile waits in the listening socket ``run`` holds and is answered when
    they are back: it is not refused."""
    port = free_port()
    env = {**_run_env(tmp_path, port), "SLOTSERVE_WEB_PROCESSES": "2"}
    run = start_run(tmp_path, env, "--port", str(port), "--no-node")
    base = f"http://127.0.0.1:{port}"
    try:
        assert healthy(base, time.monotonic() + 60), log_text(tmp_path)[-3000:]
        serving = _serving(port, besides=run.pid)
        assert len(serving) >= 2, serving
        os.kill(min(serving), signal.SIGKILL)
        answered = []
        for _ in range(30):  # 3 s, a new connection each time
            try:
                answered.append(httpx.get(f"{base}/health", timeout=5).status_code)
            except httpx.HTTPError as exc:
                answered.append(type(exc).__name__)
            time.sleep(0.1)
        assert answered == [200] * 30, (answered, log_text(tmp_path)[-3000:])
        assert eventually(lambda: len(_serving(port, besides=run.pid)) == len(serving), timeout=60, every=0.2)
        for pid in _serving(port, besides=run.pid):
            os.kill(pid, signal.SIGKILL)
        # Gone, and not started again yet (the pause before that is at least a second).
        assert eventually(lambda: not _serving(port, besides=run.pid), timeout=5, every=0.02)
        answer = httpx.get(f"{base}/health", timeout=60)
        assert answer.status_code == 200
        assert run.poll() is None, log_text(tmp_path)[-3000:]
    finally:
        os.killpg(run.pid, signal.SIGINT)
        run.wait(timeout=60)


def _serving(port: int, besides: int) -> set[int]:
    """The live processes other than ``besides`` that hold the socket listening on ``port``."""
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                listening.add(f"socket:[{fields[9]}]")
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == besides:
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if any(os.readlink(fd) in listening for fd in (entry / "fd").iterdir()):
                found.add(int(entry.name))
        except OSError:
            continue
    return found
