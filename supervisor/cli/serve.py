"""`forkvisor run` and `forkvisor demo`: the commands that run a manager."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from jobs import Call, JobOptions, Queue, Registry, command_call, format_duration
from supervisor import privileges
from supervisor.cli import environment
from supervisor.cli.common import Commands, Parser, UsageError, add_command, positive_duration, queue_cap
from supervisor.errors import AppNotFound
from supervisor.manager import Manager
from supervisor.settings import default
from supervisor.snapshot import describe


def add_commands(commands: Commands[Parser]) -> None:
    _add_run(commands)
    demo = add_command(commands, "demo", _demo, "create a demo queue, enqueue a mix of jobs, run them, show the end")
    demo.add_argument("--dir", type=Path, help="where to create the queue (default: a new temporary folder)")
    demo.set_defaults(log_default="INFO")


TIMING = {  # the manager's durations; their defaults are `Settings`' (see supervisor/settings.py)
    "--horizon": "--burst leaves jobs due later",
    "--lease": "silence before claims are taken back",
    "--sweep-interval": "between sweeps",
    "--drain-timeout": "running jobs' time on a drain",
    "--kill-grace": "between SIGTERM and SIGKILL",
    "--poll-interval": "safety-net rescan of the queue",
    "--retention": "purge done jobs older than this",
    "--stall-timeout": "--burst gives up after failing this long",
    "--max-runtime": "drain and exit 0 after serving this long",
}


def _shown(value: object) -> str:
    if value == 0.0:
        return "a sixth of the lease, at most 5s"  # sweep_interval
    return format_duration(value) if isinstance(value, float) else str(value)


def _add_run(commands: Commands[Parser]) -> None:
    run = add_command(commands, "run", _run, "run a manager on one or several queues")
    run.add_argument(
        "queues", nargs="+", type=Path, metavar="QUEUE", help="the queue folder(s), in the order to claim from"
    )
    run.set_defaults(log_default="INFO")
    add_app(run, "the registry of functions jobs may call (none: command jobs only)")
    run.add_argument("--concurrency", "-c", type=int, help=f"children at once ({default('concurrency')})")
    run.add_argument(
        "--queue-concurrency",
        action="append",
        default=[],
        type=queue_cap,
        metavar="QUEUE=N",
        help="at most N of the children run QUEUE's jobs (repeatable; within --concurrency)",
    )
    run.add_argument("--burst", action="store_true", help="exit once nothing is ready, claimed or due soon")
    run.add_argument("--max-jobs", type=int, metavar="N", help="drain and exit 0 once N jobs were started")
    run.add_argument(
        "--commands",
        action=argparse.BooleanOptionalAction,
        help="run command jobs (default: yes on a private queue, no on a shared one)",
    )
    timing = run.add_argument_group("timing (durations: 90, 30s, 5m, 2h, 7d)")
    for option, what in TIMING.items():
        name = option.removeprefix("--").replace("-", "_")
        shown = "queue's" if name in ("lease", "retention") else _shown(default(name) or "no limit")
        timing.add_argument(option, type=positive_duration, help=f"{what} ({shown})")
    run.add_argument("--no-durable", action="store_true", help="skip fsync (survives crashes, not power loss)")
    run.add_argument(
        "--user", metavar="NAME", help="as root: become NAME (the queue's owner) before touching the queue or the app"
    )
    run.add_argument(
        "--run-as-submitter",
        action="store_true",
        help="as root, on a queue of root's: run each job as the member who submitted it (as at and Slurm do)",
    )
    run.add_argument(
        "--pass-env",
        action="append",
        default=[],
        metavar="NAME",
        help="with --run-as-submitter: jobs get this variable of the manager's too (repeatable; by default none)",
    )
    run.add_argument(
        "--containment",
        choices=("auto", "cgroup", "processes"),
        help="how each run's processes are kept together: a cgroup per run where this process may make them, "
        "else found by their parent and their mark (auto: the first that works here)",
    )
    run.add_argument(
        "--members-as-root",
        action="store_true",
        help="as root, on a shared queue, without --run-as-submitter: run members' jobs as root, on purpose",
    )


def _run(args: argparse.Namespace) -> int:
    environment.fill(args, environment.RUN, os.environ)  # a flag wins over the environment
    if args.user and args.run_as_submitter:
        raise UsageError(
            "--user and --run-as-submitter exclude each other: a manager either becomes one user, "
            "or stays root to become each job's submitter"
        )
    if args.user:
        privileges.become(args.user)  # first: nothing is read, imported or forked as root
    registry = load_app(args.app, args.path) if args.app else None
    queues = [Queue(path, create=False, durable=not args.no_durable) for path in args.queues]
    timing = (option[2:].replace("-", "_") for option in TIMING)
    given = {name: getattr(args, name) for name in ("concurrency", "max_jobs", *timing)}
    given.update(commands=args.commands, run_as_submitter=args.run_as_submitter or None)
    given.update(pass_env=tuple(args.pass_env) or None, members_as_root=args.members_as_root or None)
    given.update(containment=args.containment)
    settings = {name: value for name, value in given.items() if value is not None}
    manager = Manager(queues, registry, queue_concurrency=dict(args.queue_concurrency), **settings)
    return manager.run(burst=args.burst)


def add_app(command: argparse.ArgumentParser, what: str) -> None:
    command.add_argument("--app", metavar="MODULE:REGISTRY", help=what)
    command.add_argument(
        "--path",
        action="append",
        default=[],
        metavar="DIR",
        help="look for the --app module in DIR first (repeatable; the current folder only with --path .)",
    )


def load_app(spec: str, paths: Sequence[str] = ()) -> Registry:
    """Import `module:attribute` and check it is a Registry. The search path gets `paths`
    first; the current folder is searched only when given (`--path .`), so a module
    planted in whatever folder a manager starts in is never imported by surprise."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise AppNotFound(f"--app {spec!r} must look like MODULE:REGISTRY, e.g. tasks:registry")
    sys.path[:0] = [os.path.abspath(path) for path in paths]
    top = module_name.split(".")[0]
    if top in ("jobs", "supervisor"):
        raise AppNotFound(
            f"--app {spec}: `{top}` is forkvisor's own package, which hides a module of yours of that name; "
            "rename yours (e.g. to tasks.py)"
        )
    module = _import(spec, module_name)
    registry = getattr(module, attribute, None)
    if not isinstance(registry, Registry):
        found = "missing" if registry is None else f"a {type(registry).__name__}"
        raise AppNotFound(f"--app {spec}: {module_name}.{attribute} is {found}, not a jobs.Registry")
    return registry


def _import(spec: str, module_name: str) -> ModuleType:
    """Import the app's module; raise AppNotFound saying where and why it failed."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(f"{exc.name}.")):
            here = os.path.exists(f"{exc.name.split('.')[0]}.py") or os.path.isdir(exc.name.split(".")[0])
            hint = "; it is in the current folder, which is searched only with --path ." if here else ""
            raise AppNotFound(
                f"--app {spec}: no module named {exc.name!r} on the search path: give the folder that holds it "
                f"with --path DIR (or set PYTHONPATH){hint}"
            ) from None
        raise AppNotFound(f"--app {spec}: importing {module_name} failed: {_raised(exc)}") from None
    except (Exception, SystemExit) as exc:  # the app's own code failed: say where, not a forkvisor traceback
        raise AppNotFound(f"--app {spec}: importing {module_name} raised {_raised(exc)}") from None


def _raised(exc: BaseException) -> str:
    """`Type: message (file:line)`, the line where it was raised."""
    if isinstance(exc, SyntaxError):
        where = f"{exc.filename}:{exc.lineno}"
        message = exc.msg
    else:
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
        message = str(exc)
    return f"{type(exc).__name__}: {message} ({_relative(where)})"


def _relative(where: str) -> str:
    path, _, line = where.rpartition(":")
    try:
        shown = os.path.relpath(path)
    except ValueError:
        return where
    return f"{shown if not shown.startswith('..') else path}:{line}"


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
        print(f"{job.id}  {describe(job)[:22]:<22} {job.state.value:<5} attempts {job.attempts}  "
              f"{outcome.get('status', '-'):<18} {str(detail)[:50]}")  # fmt: skip
    prog = sys.argv[0] if sys.argv[0].endswith("forkvisor") else "forkvisor"  # as the user typed it
    print(f"\n{queue.counts()}\nlook inside: {prog} list {queue.path}; {prog} show {queue.path} {ids[-1]}")
    print(f"or with ls and cat: ls {queue.path}/done {queue.path}/dead; cat {queue.path}/dead/*/events")
    return 0


def _demo_calls() -> list[Call]:
    from supervisor import demo

    calls = [Call(demo.checksum, (f"document {n}",)) for n in range(6)]
    calls += [Call(demo.flaky, (0.6,)) for _ in range(3)]
    calls += [Call(demo.slow, (0.5,)), Call(demo.crash), Call(demo.validate, ("seven",))]
    calls.append(Call(demo.validate, (7,), options=JobOptions(priority=10)))
    calls.append(command_call(["sh", "-c", 'echo "a command job: $FORKVISOR_JOB_ID"']))
    return calls
