"""What ``./slotserve start --demo`` adds (``manage.py run --demo``): a channel on a fake GPU
serving a tiny model with a real llama-server, and one API key for the admin."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError


def demo_key(admin: Any) -> str | None:
    """A demo key for ``admin``, made at the first ``--demo`` start (None later: a key is
    shown once, and each start making one would leave a trail of them)."""
    from gateway.api_keys import api_key_create
    from gateway.models import ApiKey

    if ApiKey.objects.filter(user=admin, name="demo", revoked_at__isnull=True).exists():
        return None
    _, key = api_key_create(user=admin, name="demo")
    return str(key)


def add_demo(admin: Any, host: str, port: int, say: Callable[[str], None]) -> None:
    """A channel on a fake 24 GiB GPU serving a tiny model with a real llama-server, and the
    admin's demo key; ``say`` tells the person starting it what they can do now."""
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
    Channel.objects.get_or_create(
        name="demo-0",
        defaults={"node": node, "gpu_indexes": [0], "default_model": model, "default_preset": preset},
    )
    key = demo_key(admin)
    base = f"http://{host}:{port}"
    if key is None:  # shown at the first start; a start does not make another
        say(
            f"Demo channel demo-0 serves the model 'tiny'. {admin.username}'s demo key was shown at the "
            f"first start; make another at {base}/keys/"
        )
        return
    say(f"Demo channel demo-0 serves the model 'tiny'. API key for {admin.username}: {key}")
    say(
        f"Try: python -c \"from openai import OpenAI; c = OpenAI(base_url='{base}/v1', api_key='{key}'); "
        "print(c.chat.completions.create(model='tiny', messages=[{'role': 'user', 'content': 'hi'}], "
        'max_tokens=8).choices[0].message.content)"'
    )
