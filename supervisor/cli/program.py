"""The `forkvisor` program: the parser, logging, exit codes. The only code that
configures logging or decides an exit status (`supervisor.cli.main` runs it).

Exit codes (also in the README):
  0    success
  1    `wait`: a job it waited for ended in dead/
  2    bad usage or input: an option, a job id, JSON, a duration, a state name
  3    no such job, or a job in a state that does not allow the action
  111  the queue or the environment cannot be used (missing, not a queue, bad --app)
  124  `wait --timeout` ran out
  101  internal error: a bug in forkvisor, please report it
  130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from jobs import (
    ArgumentNotSerializable,
    BadArguments,
    InvalidJob,
    InvalidJobId,
    JobNotFound,
    JobsError,
    NotFinished,
    UnknownCallable,
    WaitTimeout,
    WrongState,
    __version__,
    storage_error,
)
from supervisor.cli import admin, environment, observe, reading, schedule, serve, submit
from supervisor.cli.common import (
    EXIT_ENVIRONMENT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    TEXT_LOG_FORMATS,
    Parser,
    UsageError,
    add_log_options,
)
from supervisor.cli.text import SafeFormatter, safe
from supervisor.errors import ConfigError, InternalError, SupervisorError

_EXIT_CODES: list[tuple[type[BaseException] | tuple[type[BaseException], ...], int]] = [
    (
        (UsageError, InvalidJobId, InvalidJob, ArgumentNotSerializable, BadArguments, ConfigError, UnknownCallable),
        EXIT_USAGE,
    ),
    ((JobNotFound, WrongState, NotFinished), EXIT_NOT_FOUND),  # (KeyTaken is a WrongState)
    (WaitTimeout, EXIT_TIMEOUT),
    ((JobsError, SupervisorError, OSError), EXIT_ENVIRONMENT),
]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.command_name == "run":  # a service's logging may come from its environment too
            environment.fill(args, environment.LOGGING, os.environ)
        level = args.log_level or getattr(args, "log_default", "WARNING")
        _configure_logging(level, args.log_format or "text", args.log_file)
        return int(args.command(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        sys.stderr.close()  # `forkvisor list | head`: the reader left; say nothing more
        return 0
    except Exception as exc:
        if isinstance(exc, OSError) and not isinstance(exc, JobsError):  # WaitTimeout is a TimeoutError too
            # what no lower layer put in words: a full, read-only or forbidden queue
            queue = getattr(args, "queue", None)
            print(f"forkvisor: {storage_error(exc, args.command_name, queue) if queue else exc}", file=sys.stderr)
            return EXIT_ENVIRONMENT
        for kinds, code in _EXIT_CODES:
            if isinstance(exc, kinds) and not isinstance(exc, InternalError):  # a bug: its traceback, below
                print(f"forkvisor: {safe(exc)}", file=sys.stderr)  # it may quote the queue's text
                return code
        logging.getLogger(__name__).exception("internal error: this is a bug in forkvisor, please report it")
        return EXIT_INTERNAL


def _parse(argv: list[str]) -> argparse.Namespace:
    """Parse, taking everything after the first `--` as the command of `submit` (argparse
    cannot place options before `--` and a variable-length positional after it)."""
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    top = parser()
    args = top.parse_args(argv)
    if command:
        if not hasattr(args, "argv"):
            top.error(f"unexpected -- {' '.join(command)}: only `submit` and `schedule add` take a command after --")
        args.argv = [*args.argv, *command]
    return args


def parser() -> Parser:
    top = Parser(prog="forkvisor", description="A fork-per-job supervisor over a queue that lives in a folder.")
    add_log_options(top)
    top.add_argument("--version", action="version", version=f"forkvisor {__version__}")
    commands = top.add_subparsers(required=True, metavar="COMMAND", parser_class=Parser)
    for module in (serve, admin, submit, schedule, reading, observe):
        module.add_commands(commands)
    return top


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, message, and the fields
    a line about a job carries (event, queue, job_id, function, attempt, duration, exit, owner...)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        document: dict[str, Any] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            document.update((key, value) for key, value in fields.items() if key not in document)
        if record.exc_info:
            document["traceback"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


def _configure_logging(level: str, style: str, path: str | None) -> None:
    handler: logging.Handler = logging.StreamHandler(sys.stderr) if path is None else _log_file(path)
    handler.setFormatter(JsonFormatter() if style == "json" else SafeFormatter(TEXT_LOG_FORMATS[style]))
    logging.basicConfig(level=level, handlers=[handler], force=True)


def _log_file(path: str) -> logging.FileHandler:
    try:
        return logging.FileHandler(path, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot open the log file {path}: {exc.strerror}") from None
