"""`forkvisor submit` (command jobs) and `forkvisor enqueue` (registered functions).

Both print the new jobs' ids on stdout, one per line, so that a script can
keep them: `id=$(forkvisor submit q -- make report)`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable, Iterable
from typing import Any

from jobs import Call, command_call
from supervisor.cli.common import (
    Commands,
    Parser,
    UsageError,
    add_command,
    add_job_options,
    add_queue,
    job_options,
    json_value,
    key_value,
    open_queue,
)
from supervisor.cli.serve import add_app, load_app


def add_commands(commands: Commands[Parser]) -> None:
    submit = add_command(commands, "submit", _submit, "submit a command job: the child execs COMMAND")
    add_queue(submit)
    submit.add_argument("argv", nargs="*", metavar="-- COMMAND [ARGS...]", help="the program and its arguments")
    submit.add_argument("--stdin", action="store_true", help="read one command per line from stdin (shell quoting)")
    submit.add_argument(
        "--chain", action="store_true", help="with --stdin: each line runs after the one before is done"
    )
    submit.add_argument("--cwd", help="folder to run in (default: the current folder)")
    submit.add_argument("--env", type=key_value, action="append", default=[], metavar="KEY=VALUE")
    add_job_options(submit)

    enqueue = add_command(commands, "enqueue", _enqueue, "enqueue a call of a registered Python function")
    add_queue(enqueue)
    enqueue.add_argument("function", metavar="FUNCTION", help="the name it is registered under")
    enqueue.add_argument("--args", type=json_value, default=[], metavar="JSON", help="a JSON array: '[1, \"a\"]'")
    enqueue.add_argument("--kwargs", type=json_value, default={}, metavar="JSON", help="a JSON object: '{\"n\": 1}'")
    add_app(enqueue, "check that FUNCTION is registered there and that the arguments fit it")
    add_job_options(enqueue)


def _submit(args: argparse.Namespace) -> int:
    options = job_options(args)
    cwd = os.path.abspath(args.cwd) if args.cwd is not None else os.getcwd()  # the manager's folder differs
    env = dict(args.env)
    if args.stdin:
        if args.argv:
            raise UsageError("give the command after -- or use --stdin, not both")
        commands = list(_read_commands(sys.stdin))
    elif args.argv:
        commands = [args.argv]
    else:
        raise UsageError("no command: write it after --, e.g. forkvisor submit QUEUE -- echo hello")
    if args.key is not None and len(commands) > 1:
        raise UsageError(f"--key names one job: give one command with it, not {len(commands)}")
    if args.chain and not args.stdin:
        raise UsageError("--chain links the lines of --stdin: give the commands on stdin, one per line")
    calls = [command_call(argv, cwd=cwd, env=env, options=options) for argv in commands]
    queue = open_queue(args)
    if args.chain:
        ids = queue.chain(calls)
    elif len(calls) == 1:
        ids = [queue.submit(calls[0])]
    elif options.depends_on:
        ids = [queue.submit(call) for call in calls]  # each waits for the same jobs
    else:
        ids = queue.enqueue_many(calls)
    _print_ids(ids)
    return 0


def _read_commands(lines: Iterable[str]) -> Iterable[list[str]]:
    """Each non-blank line not starting with # as argv, split as a shell would (no expansion)."""
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            yield shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"stdin line {number}: {exc} in {line.strip()!r:.80}; nothing was submitted") from None


def _enqueue(args: argparse.Namespace) -> int:
    if not isinstance(args.args, list):
        raise UsageError(f"--args must be a JSON array, got {type(args.args).__name__}: e.g. --args '[1, \"a\"]'")
    if not isinstance(args.kwargs, dict):
        raise UsageError(f"--kwargs must be a JSON object, got {type(args.kwargs).__name__}: e.g. --kwargs '{{}}'")
    function: Callable[..., Any] | str = args.function
    if args.app:
        function = load_app(args.app, args.path).get(args.function).fn  # UnknownCallable if it is not there
    job_id = open_queue(args).submit(Call(function, tuple(args.args), args.kwargs, job_options(args)))
    _print_ids([job_id])
    return 0


def _print_ids(ids: list[str]) -> None:
    sys.stdout.write("".join(f"{job_id}\n" for job_id in ids))
