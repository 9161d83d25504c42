"""`forkvisor web` and `forkvisor metrics`: the fleet seen from its queue folders.

Both need the `web` extra (`pip install "forkvisor[web]"`: prometheus_client); without
it they say so and exit 111, and nothing else of forkvisor needs it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from jobs import Queue
from supervisor.cli.common import Commands, Parser, UsageError, add_command, positive_duration
from supervisor.errors import Unavailable

log = logging.getLogger(__name__)
DEFAULT_PORT = 9810


def add_commands(commands: Commands[Parser]) -> None:
    web = add_command(commands, "web", _web, "serve a status page and /metrics for one or several queues")
    web.add_argument("queues", nargs="+", type=Path, metavar="QUEUE")
    web.add_argument("--bind", default="127.0.0.1", metavar="ADDR", help="address to listen on (127.0.0.1)")
    web.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on ({DEFAULT_PORT}; 0: any free)")
    web.add_argument(
        "--token",
        metavar="TOKEN",
        help="require this token on every request (or FORKVISOR_WEB_TOKEN); needed to bind beyond loopback quietly",
    )
    web.set_defaults(log_default="INFO")

    metrics = add_command(commands, "metrics", _metrics, "print the queues' Prometheus metrics, or write a textfile")
    metrics.add_argument("queues", nargs="+", type=Path, metavar="QUEUE")
    metrics.add_argument(
        "--textfile", metavar="PATH", help="write them to PATH atomically (node_exporter's textfile collector)"
    )
    metrics.add_argument(
        "--every", type=positive_duration, metavar="DURATION", help="with --textfile: write again every DURATION"
    )


def _open(paths: list[Path]) -> list[Queue]:
    return [Queue(path, create=False) for path in paths]


def _needs_extra() -> Any:
    try:
        from supervisor import metrics, web  # here: prometheus_client is an optional extra
    except ModuleNotFoundError as exc:
        raise Unavailable(
            f"this command needs {exc.name}, which forkvisor's web extra installs: pip install 'forkvisor[web]'"
        ) from None
    return metrics, web


def _web(args: argparse.Namespace) -> int:
    _, web = _needs_extra()
    token = args.token or os.environ.get("FORKVISOR_WEB_TOKEN") or None
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0 to 65535, got {args.port}")
    queues = _open(args.queues)
    if not web.is_loopback(args.bind) and token is None:
        log.warning(
            "serving on %s without a token: anyone who can reach it reads every job's arguments, results and "
            "output; give --token (or FORKVISOR_WEB_TOKEN)",
            args.bind,
        )

    def ready(server: Any) -> None:
        host, port = server.server_address[:2]
        log.info("serving %d queue(s) on http://%s:%d/ (metrics at /metrics)", len(queues), host, port)
        print(f"http://{'localhost' if web.is_loopback(host) else host}:{port}/", flush=True)

    try:
        web.serve(queues, args.bind, args.port, token, ready)
    except OSError as exc:
        raise Unavailable(f"cannot listen on {args.bind}:{args.port}: {exc.strerror or exc}") from None
    return 0


def _metrics(args: argparse.Namespace) -> int:
    metrics, _ = _needs_extra()
    if args.every is not None and args.textfile is None:
        raise UsageError("--every writes a textfile again and again: give --textfile too")
    queues = _open(args.queues)
    if args.textfile is None:
        sys.stdout.buffer.write(metrics.exposition(queues))
        return 0
    while True:
        metrics.write_textfile(queues, args.textfile)
        if args.every is None:
            return 0
        time.sleep(args.every)  # a periodic export, not a wait for a condition
