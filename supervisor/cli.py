"""The `forkvisor` command. The only module that configures logging or exits.

Exit codes: 0 ok; 2 usage; 111 the queue or environment is unusable;
101 an internal error (a bug: please report it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from jobs import JobOptions, JobsError, Queue, Registry
from jobs.store import Call
from supervisor.errors import AppNotFound, SupervisorError
from supervisor.manager import DRAIN_FILE, Manager

EXIT_USAGE = 2
EXIT_ENVIRONMENT = 111
EXIT_INTERNAL = 101
LOG_FORMATS = {
    "text": "%(asctime)s %(levelname)s %(name)s: %(message)s",
    "short": "%(levelname)s %(message)s",
    "json": '{"time": "%(asctime)s", "level": "%(levelname)s", "logger": "%(name)s", "message": %(message_json)s}',
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _configure_logging(args.log_level, args.log_format)
    try:
        return int(args.command(args))
    except (JobsError, SupervisorError, OSError) as exc:
        print(f"forkvisor: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except KeyboardInterrupt:
        return 130
    except Exception:
        logging.getLogger(__name__).exception("internal error: this is a bug in forkvisor, please report it")
        return EXIT_INTERNAL


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forkvisor", description="A fork-per-job supervisor over a queue folder.")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--log-format", default="text", choices=sorted(LOG_FORMATS))
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    _add_run(commands)
    _add(
        commands, "demo", _demo, "create a demo queue, enqueue a mix of jobs, run them, show what happened"
    ).add_argument("--dir", type=Path, help="where to create the queue (default: a new temporary folder)")
    init = _add(commands, "init", _init, "create a queue folder")
    init.add_argument("queue", type=Path)
    init.add_argument("--shared", action="store_true", help="group-writable queue (mode 2770) for several users")
    _add(commands, "drain", _drain, "ask every manager of the queue, on any host, to drain").add_argument(
        "queue", type=Path
    )
    status = _add(commands, "status", _status, "count the jobs in each state")
    status.add_argument("queue", type=Path)
    status.add_argument("--json", action="store_true")
    return parser


_Commands = argparse._SubParsersAction  # argparse names this type only privately


def _add(
    commands: _Commands[argparse.ArgumentParser], name: str, handler: Callable[..., int], text: str
) -> argparse.ArgumentParser:
    command: argparse.ArgumentParser = commands.add_parser(name, help=text, description=text)
    command.set_defaults(command=handler)
    return command


def _add_run(commands: _Commands[argparse.ArgumentParser]) -> None:
    run = _add(commands, "run", _run, "run a manager on a queue")
    run.add_argument("queue", type=Path)
    run.add_argument("--app", required=True, help="MODULE:REGISTRY, the registry of functions jobs may call")
    run.add_argument("--concurrency", "-c", type=int, default=os.cpu_count() or 2, help="children at once")
    run.add_argument("--burst", action="store_true", help="exit once nothing is ready, claimed or due soon")
    run.add_argument("--horizon", type=float, default=300.0, help="--burst leaves jobs due later than this (s)")
    run.add_argument("--lease", type=float, default=30.0, help="seconds of silence before claims are taken back")
    run.add_argument("--sweep-interval", type=float, default=5.0, help="seconds between sweeps")
    run.add_argument("--drain-timeout", type=float, default=60.0, help="seconds running jobs get on a drain")
    run.add_argument("--kill-grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    run.add_argument("--poll-interval", type=float, default=1.0, help="safety-net rescan of the queue (s)")
    run.add_argument("--retention", type=float, help="purge done jobs older than this many seconds")
    run.add_argument("--no-durable", action="store_true", help="skip fsync (survives crashes, not power loss)")


def _run(args: argparse.Namespace) -> int:
    registry = load_app(args.app)
    queue = Queue(args.queue, create=False, durable=not args.no_durable)
    manager = Manager(
        queue,
        registry,
        concurrency=args.concurrency,
        horizon=args.horizon,
        lease=args.lease,
        sweep_interval=args.sweep_interval,
        drain_timeout=args.drain_timeout,
        kill_grace=args.kill_grace,
        poll_interval=args.poll_interval,
        retention=args.retention,
    )
    return manager.run(burst=args.burst)


def load_app(spec: str) -> Registry:
    """Import `module:attribute` (the current folder is importable) and check it is a Registry."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise AppNotFound(f"--app {spec!r} must look like MODULE:REGISTRY, e.g. tasks:registry")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppNotFound(f"--app {spec}: cannot import {module_name} ({exc})") from None
    registry = getattr(module, attribute, None)
    if not isinstance(registry, Registry):
        raise AppNotFound(f"--app {spec}: {module_name}.{attribute} is {type(registry).__name__}, not a jobs.Registry")
    return registry


def _init(args: argparse.Namespace) -> int:
    queue = Queue(args.queue, create=True, shared=args.shared)
    print(queue.path)
    return 0


def _drain(args: argparse.Namespace) -> int:
    queue = Queue(args.queue, create=False)
    request = queue.path / DRAIN_FILE
    staging = queue.path / f".{DRAIN_FILE}.{os.getpid()}"
    staging.write_text(f"drain requested at {time.time()}\n")
    os.replace(staging, request)  # a rename, so watching managers see it at once
    print(f"asked every manager of {queue.path} to drain")
    return 0


def _status(args: argparse.Namespace) -> int:
    counts = Queue(args.queue, create=False).counts()
    if args.json:
        print(json.dumps({"counts": counts}))
    else:
        print("  ".join(f"{state} {number}" for state, number in counts.items()))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from supervisor import demo

    folder = args.dir or Path(tempfile.mkdtemp(prefix="forkvisor-demo-"))
    queue = Queue(folder)
    ids = queue.enqueue_many(_demo_calls())
    print(f"demo queue: {queue.path} ({len(ids)} jobs enqueued); running a manager in burst mode\n")
    Manager(queue, demo.registry, concurrency=2, lease=10, sweep_interval=1).run(burst=True)
    print()
    for job_id in ids:
        job = queue.job(job_id)
        outcome = (job.history[-1].outcome or {}) if job.history else {}
        detail = json.dumps(job.result) if job.result is not None else (job.error or {}).get("message", "")
        print(f"{job.id}  {job.function:<14} {job.state.value:<5} attempts {job.attempts}  "
              f"{outcome.get('status', '-'):<18} {str(detail)[:60]}")  # fmt: skip
    print(f"\n{queue.counts()}\nlook inside: ls {queue.path}/done {queue.path}/dead; cat {queue.path}/dead/*/events")
    return 0


def _demo_calls() -> list[Call]:
    from supervisor import demo

    calls = [Call(demo.checksum, (f"document {n}",)) for n in range(6)]
    calls += [Call(demo.flaky, (0.6,)) for _ in range(3)]
    calls += [Call(demo.slow, (0.5,)), Call(demo.crash), Call(demo.validate, ("seven",))]
    calls.append(Call(demo.validate, (7,), options=JobOptions(priority=10)))
    return calls


class _JsonMessageFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        record.message_json = json.dumps(record.getMessage())
        return super().format(record)


def _configure_logging(level: str, style: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    formatter_class = _JsonMessageFormatter if style == "json" else logging.Formatter
    handler.setFormatter(formatter_class(LOG_FORMATS[style]))
    logging.basicConfig(level=level, handlers=[handler], force=True)


if __name__ == "__main__":
    sys.exit(main())
