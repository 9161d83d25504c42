"""What every `forkvisor` command shares: the parser, argument types, exit codes,
opening the queue, and formatting numbers for people."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, TypeGuard

from jobs import Backoff, InvalidJob, JobOptions, Queue, State, format_duration, parse_duration, parse_size
from supervisor.errors import SupervisorError

EXIT_OK = 0
EXIT_JOB_DEAD = 1  # `wait`: a job it waited for ended in dead/
EXIT_USAGE = 2  # a bad option, argument, id, JSON, duration or state name
EXIT_NOT_FOUND = 3  # no such job, or the job is in a state that does not allow the action
EXIT_ENVIRONMENT = 111  # the queue or the environment cannot be used
EXIT_INTERNAL = 101  # a bug in forkvisor
EXIT_TIMEOUT = 124  # `wait --timeout` ran out (as timeout(1) does)
EXIT_INTERRUPTED = 130


class UsageError(SupervisorError):
    """Bad input on the command line; the message says what was wrong and how to fix it."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr, never the usage dump."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse takes `-5s` for an option, so `--timeout -5s` said "expected one argument";
        # as a value, our own check says what is wrong with it ("must be positive").
        self._negative_number_matcher = _NEGATIVE_VALUE

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


Commands = argparse._SubParsersAction  # argparse names this type only privately
_NEGATIVE_VALUE = re.compile(r"^-\d[\d.]*[a-z]*$|^-\.\d+$")


def add_command(
    commands: Commands[Parser], name: str, handler: Callable[[argparse.Namespace], int], text: str
) -> Parser:
    command: Parser = commands.add_parser(name, help=text, description=text)
    command.set_defaults(command=handler, command_name=name)
    add_log_options(command, default=argparse.SUPPRESS)  # also after the command: `run Q --log-format json`
    return command


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
TEXT_LOG_FORMATS = {
    "text": "%(asctime)s %(levelname)s %(name)s: %(message)s",
    "short": "%(levelname)s %(message)s",
}
LOG_STYLES = ("json", *sorted(TEXT_LOG_FORMATS))  # json: one object per line (program.JsonFormatter)


def add_log_options(parser: argparse.ArgumentParser, default: object = None) -> None:
    """--log-level, --log-format and --log-file, before the command or after it (there with
    `default=SUPPRESS`, so an option given before is not reset)."""
    group = parser.add_argument_group("logging") if default is argparse.SUPPRESS else parser
    group.add_argument("--log-level", choices=LOG_LEVELS, default=default, help="INFO for run and demo, else WARNING")
    group.add_argument("--log-format", choices=LOG_STYLES, default=default, help="text (default), short or json")
    group.add_argument(
        "--log-file", metavar="PATH", default=default, help="append the log here, not to stderr (reopened on SIGHUP)"
    )


def add_queue(command: argparse.ArgumentParser) -> None:
    command.add_argument("queue", type=Path, metavar="QUEUE", help="the queue folder")


def open_queue(args: argparse.Namespace, durable: bool = True) -> Queue:
    return Queue(args.queue, create=False, durable=durable)


# -- argument types: each raises ArgumentTypeError with a message that says how to fix it --


def duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_duration(text: str) -> float:
    seconds = duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive (longer than 0)")
    return seconds


def queue_cap(text: str) -> tuple[Path, int]:
    """`QUEUE=N`: a queue folder and the most children that may run its jobs."""
    path, equals, count = text.rpartition("=")
    if not equals or not path:
        raise argparse.ArgumentTypeError(f"{text!r} must look like QUEUE=N, e.g. queues/bulk=2")
    try:
        cap = int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {count!r} is not a whole number") from None
    if cap < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the concurrency must be at least 1")
    return Path(path), cap


def limit_duration(text: str) -> float:
    """A job's timeout: positive, or `none` (0) for no limit whatever its function or queue say."""
    if text.strip().lower() in ("none", "0"):
        return 0.0
    return positive_duration(text)


def limit_size(text: str) -> int:
    """A job's memory limit: a size, or `none` (0) for no limit."""
    return 0 if text.strip().lower() in ("none", "0") else size(text)


def backoff(text: str) -> str:
    try:
        return str(Backoff.parse(text))
    except InvalidJob as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def state(text: str) -> State:
    try:
        return State(text.lower())
    except ValueError:
        names = ", ".join(s.value for s in State)
        raise argparse.ArgumentTypeError(f"{text!r} is not a state; the states are {names}") from None


def terminal_state(text: str) -> State:
    found = state(text)
    if not found.terminal:
        raise argparse.ArgumentTypeError(f"{text!r}: only done and dead jobs can be purged")
    return found


def json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid JSON ({exc})") from None


def moment(text: str) -> float:
    """An ISO 8601 time (local time unless it says otherwise) or epoch seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: give ISO 8601 (2026-12-01T09:30, 2026-12-01 09:30+01:00) or epoch seconds"
        ) from None


def size(text: str) -> int:
    """Bytes in `512M`, `2G`, `100k` or a plain number."""
    try:
        number = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: write bytes or 100k, 512M, 2G")
    return number


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} must look like KEY=VALUE")
    return key, value


# -- per-job options, shared by submit and enqueue ------------------------------------------


def add_job_options(command: argparse.ArgumentParser) -> None:
    group = command.add_argument_group("job options (default: the function's, else the queue's)")
    group.add_argument("--max-attempts", type=int, metavar="N", help="attempts before dead/")
    group.add_argument("--timeout", type=limit_duration, metavar="DURATION", help="e.g. 90, 30s, 5m, 2h; none")
    group.add_argument("--priority", type=int, default=None, metavar="P", help="-100..100, higher first (0)")
    when = group.add_mutually_exclusive_group()
    when.add_argument("--delay", type=duration, metavar="DURATION", help="run no earlier than this from now")
    when.add_argument("--at", type=moment, metavar="TIME", help="run no earlier than this (ISO 8601 or epoch)")
    group.add_argument("--memory-limit", type=limit_size, metavar="SIZE", help="stop the job above this RSS (512M)")
    group.add_argument(
        "--output-limit", type=limit_size, metavar="SIZE", help="stdout, and stderr, a run keeps: head and tail (8M)"
    )
    group.add_argument("--backoff", type=backoff, metavar="BACKOFF", help="'fixed 30s' or 'exponential 1s 5m'")
    group.add_argument(
        "--meta", type=key_value, action="append", default=[], metavar="KEY=VALUE", help="metadata (repeatable)"
    )
    group.add_argument(
        "--key", metavar="KEY", help="at most one unfinished job per KEY: a taken key prints the live job's id"
    )
    group.add_argument(
        "--after",
        action="append",
        default=[],
        metavar="ID",
        help='wait until job ID is done (repeatable; one value may hold several ids: --after "$ids")',
    )
    group.add_argument(
        "--allow-failure", action="store_true", help="with --after: run once they ended, even if one is dead"
    )
    group.add_argument(
        "--key-taken",
        choices=("return", "fail"),
        default="return",
        help="when a live job holds --key: print its id (return, the default) or fail with exit 3",
    )


def job_options(args: argparse.Namespace) -> JobOptions:
    metadata = {key: _maybe_json(value) for key, value in args.meta}
    return JobOptions(
        max_attempts=args.max_attempts,
        timeout=args.timeout,
        priority=args.priority,
        delay=args.delay,
        run_at=args.at,
        memory_limit=args.memory_limit,
        output_limit=args.output_limit,
        backoff=args.backoff,
        metadata=metadata or None,
        key=args.key,
        if_key_taken="raise" if args.key_taken == "fail" else "return",
        depends_on=after(args.after) or None,
        allow_failure=args.allow_failure,
    )


def after(values: list[str]) -> list[str]:
    """The job ids of `--after`s, each value split on spaces, commas and newlines (so that
    the ids another command printed can be given as one word)."""
    return [job_id for value in values for job_id in value.replace(",", " ").split()]


def _maybe_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a plain word stays a string


# -- output -------------------------------------------------------------------------


def print_json(document: Any) -> None:
    print(json.dumps(document, indent=None, default=str), flush=True)  # --watch into a pipe: now, not at exit


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    return format_duration(round(seconds / 60) * 60 if seconds < 86400 else round(seconds / 3600) * 3600)


def megabytes(size_in_bytes: int | None) -> str:
    return "-" if size_in_bytes is None else f"{size_in_bytes / 2**20:.1f}M"


def when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


def progress_share(progress: dict[str, Any]) -> float | None:
    """How far a progress record says the job is (0 to 1), None if it names no end."""
    done, total = progress.get("done"), progress.get("total")
    if not _number(done) or not _number(total) or total <= 0:
        return None
    return max(0.0, min(1.0, done / total))


def progress_text(progress: dict[str, Any] | None, now: float) -> str:
    """`3/10 (30%) resized a.png, 2s ago` from a progress record ("" for none)."""
    if progress and isinstance(unreadable := progress.get("unreadable"), str):
        return f"progress unreadable: {unreadable}"
    if not progress or not _number(done := progress.get("done")):
        return ""
    text = f"{done:g}"
    if (share := progress_share(progress)) is not None:
        text += f"/{progress['total']:g} ({100 * share:.0f}%)"
    message = progress.get("message")
    if isinstance(message, str) and message:
        text += f" {message}"
    if _number(at := progress.get("at")):
        text += f", {ago(max(0.0, now - at))} ago"
    return text


def _number(value: object) -> TypeGuard[float]:
    """A JSON number a float holds (not true or false, which Python counts as ints, nor an
    int of 400 digits, which no division or format survives)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= 1e300
