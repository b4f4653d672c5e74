"""One process of the web part: uvicorn serving SlotServe's pages, API and gateway.

``manage.py run`` holds the listening socket itself and starts several of these on it
(``--fd``), each a process of its own that it starts again when it dies: a crash of one costs
the others nothing, and a connection made while every one is down waits in the socket's queue
until one is back instead of being refused (docs/faults.md, "A web process killed"). Alone
(``--host``/``--port``), one process listens on an address of its own.

    python -m slotserve_site.running.web --fd 3
    python -m slotserve_site.running.web --host 127.0.0.1 --port 8000
"""

from __future__ import annotations

import argparse
import os
import socket


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m slotserve_site.running.web", description=__doc__)
    parser.add_argument("--fd", type=int, help="serve on this inherited listening socket")
    parser.add_argument("--host", default="127.0.0.1", help="without --fd: the address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="without --fd: the port to listen on")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "slotserve_site.settings")

    import uvicorn

    from slotserve_site.running.parts import web_options

    server = uvicorn.Server(uvicorn.Config(**web_options(), host=args.host, port=args.port))
    if args.fd is None:
        server.run()
    else:
        # Not uvicorn's own --fd, which takes every socket for a Unix one (no TCP_NODELAY on the
        # streams, no client address): the socket says what it is.
        server.run(sockets=[socket.socket(fileno=args.fd)])


if __name__ == "__main__":
    main()
