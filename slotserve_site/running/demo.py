"""What ``./slotserve start --demo`` adds (``manage.py run --demo``): a channel on a fake GPU
serving a tiny model with a real llama-server, and one API key for the admin; and what every
start says last, once SlotServe answers (``tell_when_ready``)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import httpx
from django.conf import settings
from django.core.management.base import CommandError
from django.urls import reverse


def demo_key(admin: Any) -> str | None:
    """A demo key for ``admin``, made at the first ``--demo`` start (None later: a key is
    shown once, and each start making one would leave a trail of them)."""
    from gateway.api_keys import api_key_create
    from gateway.models import ApiKey

    if ApiKey.objects.filter(user=admin, name="demo", revoked_at__isnull=True).exists():
        return None
    _, key = api_key_create(user=admin, name="demo")
    return str(key)


class Demo(NamedTuple):
    """What a first ``--demo`` start made: the admin's key, and the demo channel's story page."""

    key: str
    story: str


def add_demo(admin: Any, host: str, port: int, say: Callable[[str], None]) -> Demo | None:
    """A channel on a fake 24 GiB GPU serving a tiny model with a real llama-server, and the
    admin's demo key (at the first start; None later); ``say`` tells the person starting it
    what they can do now."""
    from channels_app.models import Channel, LLMModel, Node, Preset
    from devtools.tinymodel import write_tiny_llama

    os.environ.setdefault("SLOTSERVE_FAKE_GPUS", "1x24GiB")
    if "SLOTSERVE_LLAMA_SERVER" not in os.environ:
        say("Building llama-server once for this machine (several minutes the first time)…")
        script = Path(settings.BASE_DIR) / "scripts" / "build-llama-server"
        built = subprocess.run(
            [str(script)], capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable}
        )
        if built.returncode != 0:
            raise CommandError(f"could not build llama-server:\n{built.stderr[-2000:]}")
        os.environ["SLOTSERVE_LLAMA_SERVER"] = built.stdout.strip().splitlines()[-1]
    path = write_tiny_llama(Path(settings.DATA_DIR) / "models" / "tiny.gguf")
    model, _ = LLMModel.objects.get_or_create(
        name="tiny",
        defaults={"backend": "llama.cpp", "path": str(path), "size_bytes": path.stat().st_size},
    )
    preset, _ = Preset.objects.get_or_create(model=model, name="chat", defaults={"args": "-c 512 -t 2"})
    node, _ = Node.objects.get_or_create(name=settings.SLOTSERVE_NODE_NAME)
    channel, _ = Channel.objects.get_or_create(
        name="demo-0",
        defaults={"node": node, "gpu_indexes": [0], "default_model": model, "default_preset": preset},
    )
    key = demo_key(admin)
    if key is None:  # shown at the first start; a start does not make another
        say(
            f"Demo channel demo-0 will serve the model 'tiny'. {admin.username}'s demo key was shown at "
            f"the first start; make another at http://{host}:{port}/keys/"
        )
        return None
    say(f"Demo channel demo-0 will serve the model 'tiny'. API key for {admin.username}: {key}")
    return Demo(key, reverse("story", args=[channel.pk]))


# How long the demo's model may take to answer its first request before the person is told
# where to look instead: a first build of llama-server is done before the parts start.
READY_WITHIN_SECONDS = 300.0


def try_line(base: str, key: str) -> str:
    """A shell line that streams a completion from the demo's model, as printed: this project's
    own interpreter (it has the ``openai`` library), one dot for a piece with no text yet (the
    tiny model's random bytes are often parts of a character)."""
    code = (
        f"from openai import OpenAI; c = OpenAI(base_url='{base}/v1', api_key='{key}'); "
        "s = c.chat.completions.create(model='tiny', messages=[{'role': 'user', 'content': 'hi'}], "
        "max_tokens=16, stream=True); "
        "[print(e.choices[0].delta.content or '.', end='', flush=True) for e in s if e.choices]; print()"
    )
    return f'{shlex.quote(sys.executable)} -c "{code}"'


def answers(base: str, key: str) -> bool:
    """Whether the demo's model answers a request through the gateway now."""
    try:
        answer = httpx.post(
            f"{base}/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
    except httpx.HTTPError:
        return False
    return answer.status_code == 200


def tell_when_ready(
    base: str,
    admin: str,
    password: str | None,
    demo: Demo | None,
    *,
    say: Callable[[str], None],
    stopping: Callable[[], bool],
    every: float = 1.0,
) -> None:
    """What the person who started SlotServe needs, last and plainly, once it answers: where to
    sign in (with the first admin's password, the start that made it); then, for the demo,
    once its model answers, the line to try it, or after ``READY_WITHIN_SECONDS`` where to look.
    Runs beside the supervisor (a thread), until ``stopping()``."""
    deadline = time.monotonic() + READY_WITHIN_SECONDS
    while not stopping() and not _healthy(base):
        if time.monotonic() >= deadline:
            return  # the supervisor says which part keeps dying
        time.sleep(every)
    if stopping():
        return
    said = f" with the password {password} (shown this once)" if password else ""
    say(f"Ready. Sign in at {base}/ as {admin!r}{said}.")
    if demo is None:
        return
    while not stopping():
        if answers(base, demo.key):
            say("The demo model answers. Try it (it streams):")
            say(f"  {try_line(base, demo.key)}")
            return
        if time.monotonic() >= deadline:
            say(
                f"The demo model did not answer within {READY_WITHIN_SECONDS:.0f} s: its channel's "
                f"story says why ({base}{demo.story})"
            )
            return
        time.sleep(every)


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
