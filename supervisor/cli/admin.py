"""Commands that change a queue or wait on it: init, config, drain, retry, cancel,
purge, wait."""

from __future__ import annotations

import argparse
import grp
import pwd
import sys
import time
from collections.abc import Callable
from typing import Any

from jobs import (
    QUEUE_SETTINGS,
    InvalidJobId,
    JobsError,
    Queue,
    State,
    check_setting,
    format_duration,
    format_size,
    owner_group_members,
)
from supervisor.cli.common import (
    EXIT_JOB_DEAD,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    Commands,
    Parser,
    UsageError,
    add_command,
    add_queue,
    duration,
    open_queue,
    positive_duration,
    print_json,
    progress_share,
    progress_text,
    stderr_is_terminal,
    terminal_state,
)
from supervisor.cli.text import safe

SETTINGS = QUEUE_SETTINGS
UNSET = "default"  # `config QUEUE KEY default`: the built-in value again


def add_commands(commands: Commands[Parser]) -> None:
    init = add_command(commands, "init", _init, "create a queue folder (or set the settings of an existing one)")
    add_queue(init)
    init.add_argument(
        "--shared", action="store_true", help="members of the queue's group may submit and read (docs/SECURITY.md)"
    )
    init.add_argument("--group", metavar="GROUP", help="with --shared: the queue's group (default: the folder's)")
    init.add_argument(
        "--owner-group",
        metavar="GROUP",
        help="with --shared: the group of incoming/, one only the owner is in (default: the owner's own group)",
    )
    init.add_argument("--max-attempts", type=int, help="attempts a job gets unless it or its function says (3)")
    init.add_argument("--timeout", help="a job's timeout unless it or its function says: 30s, 5m, none (none)")
    init.add_argument("--memory-limit", help="a job's RSS limit unless it or its function says: 512M, none (none)")
    init.add_argument("--output-limit", help="stdout and stderr a run keeps, head and tail: 1M, none (8M)")
    init.add_argument("--backoff", help="delay between attempts: 'fixed 30s', 'exponential 1s 5m' (the latter)")
    init.add_argument("--lease", help="silence after which a manager's claims are taken back (30s)")
    init.add_argument("--retention", help="purge done jobs older than this: 7d, none (none: keep)")

    settings = add_command(commands, "config", _config, "show or change a queue's settings")
    add_queue(settings)
    settings.add_argument("key", nargs="?", metavar="KEY", help=f"one of {', '.join(SETTINGS)}")
    settings.add_argument(
        "value", nargs="?", metavar="VALUE", help=f"the new value (30s, 5m, 7d, 512M, none; {UNSET}: the built-in one)"
    )
    settings.add_argument("--json", action="store_true")

    add_queue(add_command(commands, "drain", _drain, "ask every manager of the queue, on any host, to drain"))
    for name, action, what in (
        ("pause", _pause, "every manager, on any host, starts no job of the queue (or of --function) until resumed"),
        ("resume", _resume, "undo pause (for --function, or everything; --job thaws one running job)"),
    ):
        command = add_command(commands, name, action, what)
        add_queue(command)
        which = command.add_mutually_exclusive_group()
        which.add_argument("--function", action="append", metavar="F", help="only this function's jobs (repeatable)")
        which.add_argument(
            "--job", metavar="ID", help="freeze (thaw) every process of one running job; its timeout stands still"
        )

    retry = add_command(commands, "retry", _retry, "send dead jobs back to ready/ with fresh attempts")
    add_queue(retry)
    retry.add_argument("jobs", nargs="*", metavar="JOB")
    retry.add_argument("--dead", action="store_true", help="every dead job (with --function: of that function)")
    retry.add_argument("--function", metavar="F", help="with --dead: only jobs of this function")

    cancel = add_command(commands, "cancel", _cancel, "cancel jobs: queued ones go to dead/, running ones are stopped")
    add_queue(cancel)
    cancel.add_argument("jobs", nargs="*", metavar="JOB")
    cancel.add_argument(
        "--function", metavar="F", help="every ready or scheduled job of F (say, one no manager will ever run)"
    )

    purge = add_command(commands, "purge", _purge, "delete finished jobs older than a duration")
    add_queue(purge)
    purge.add_argument("--state", type=terminal_state, required=True, metavar="done|dead")
    purge.add_argument("--older-than", type=duration, required=True, metavar="DURATION", help="e.g. 7d, 12h")
    purge.add_argument("--dry-run", action="store_true", help="list what would go, delete nothing")
    purge.add_argument("--json", action="store_true")

    wait = add_command(commands, "wait", _wait, "wait until jobs (default: all unfinished now) are done or dead")
    add_queue(wait)
    wait.add_argument("jobs", nargs="*", metavar="JOB", help="job ids; - reads them from stdin, one per line")
    wait.add_argument("--timeout", type=positive_duration, metavar="DURATION", help="give up after (exit 124)")
    wait.add_argument("--json", action="store_true", help="print each job's final state")


# -- settings ---------------------------------------------------------------------------


def _init(args: argparse.Namespace) -> int:
    changes = {key: getattr(args, key, None) for key in SETTINGS if getattr(args, key, None) is not None}
    for key, value in changes.items():
        check_setting(key, value)  # before anything is created
    if (args.group or args.owner_group) and not args.shared:
        raise UsageError("--group and --owner-group name the groups of a shared queue: use them with --shared")
    gid = _group_id(args.group) if args.group else None
    queue = Queue(args.queue, create=True, shared=args.shared)
    if args.shared and not queue.shared:
        raise UsageError(
            f"{queue.path} is already a private queue; --shared applies only when creating one "
            "(make a new shared queue and move the jobs over)"
        )
    if not queue.owned:
        raise UsageError(f"{queue.path} belongs to another user: only its owner can set it up")
    if gid is not None:
        queue.serving.set_group(gid)
    if queue.shared:
        queue.serving.set_owner_group(_owner_group(queue, args.owner_group))
    for change in queue.serving.tighten():  # a queue made by an earlier forkvisor, or by hand
        print(f"forkvisor: tightened {change}", file=sys.stderr)
    if changes:
        queue.configure(**changes)
    print(queue.path)
    return 0


def _owner_group(queue: Queue, name: str | None) -> int:
    """The group for a shared queue's incoming/: one only its owner is in (docs/SECURITY.md)."""
    owner = queue.owner_uid
    gid = _group_id(name) if name else pwd.getpwuid(owner).pw_gid
    shown = grp.getgrgid(gid).gr_name
    fix = (
        "members' submission folders would be writable by them, so a submission could not say who made it; "
        f"give --owner-group a group only the owner is in (groupadd fvq-{pwd.getpwuid(owner).pw_name}; "
        "usermod -aG it the owner)"
    )
    others = owner_group_members(gid, owner, every_user=True)
    if others:
        raise UsageError(f"group {shown} has members besides the owner ({', '.join(others[:5])}): {fix}")
    return gid


def _group_id(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise UsageError(f"no group named {name!r} on this host: create it first (groupadd {name})") from None


def _config(args: argparse.Namespace) -> int:
    queue = open_queue(args)
    if args.key is not None and args.key not in SETTINGS:
        raise UsageError(f"{args.key!r} is not a queue setting; the settings are: {', '.join(SETTINGS)}")
    if args.value is not None:
        queue.configure(**{args.key: None if args.value == UNSET else args.value})
    settings, stored = queue.settings, queue.stored_settings
    if args.json:
        print_json(settings if args.key is None else {args.key: settings[args.key]})
    elif args.key is not None:
        print(_shown(args.key, settings[args.key]))
    else:
        width = max(len(_shown(key, settings[key])) for key in SETTINGS)
        for key in SETTINGS:
            note = "" if key in stored else "  (default)"
            print(f"{key:<14}{_shown(key, settings[key]):<{width}}{note}".rstrip())
    return 0


def _shown(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key in ("memory_limit", "output_limit"):
        return format_size(value)
    if key in ("max_attempts", "backoff"):
        return str(value)
    return format_duration(value)


def _drain(args: argparse.Namespace) -> int:
    queue = open_queue(args)
    queue.request_drain()
    print(f"asked every manager of {queue.path} to drain")
    return 0


def _pause(args: argparse.Namespace) -> int:
    queue = open_queue(args)
    if args.job is not None:
        run = queue.freeze(args.job)
        print(f"job {args.job} run {run}: its manager freezes it now (`forkvisor resume {queue.path} --job` thaws it)")
        return 0
    paused = queue.pause(args.function)
    print(f"paused in {queue.path}: {paused.describe()} (running jobs finish; `forkvisor resume` undoes it)")
    return 0


def _resume(args: argparse.Namespace) -> int:
    queue = open_queue(args)
    if args.job is not None:
        run = queue.freeze(args.job, frozen=False)
        print(f"job {args.job} run {run}: its manager thaws it now")
        return 0
    paused = queue.resume(args.function)
    print(f"still paused in {queue.path}: {paused.describe()}" if paused else f"nothing is paused in {queue.path}")
    return 0


# -- operator actions on jobs -----------------------------------------------------------


def _retry(args: argparse.Namespace) -> int:
    if args.function and not args.dead:
        raise UsageError("--function selects among dead jobs: use it with --dead")
    if bool(args.jobs) == args.dead:
        raise UsageError("name the jobs to retry, or give --dead for every dead job (not both)")
    queue = open_queue(args)
    ids = args.jobs or [job.id for job in queue.jobs(State.DEAD, function=args.function)]

    def retry(job_id: str) -> str:
        if not queue.owned:
            return _ask(queue, job_id, "retry")
        queue.retry(job_id)
        return "ready again, attempts reset"

    return _each(ids, retry)


def _ask(queue: Queue, job_id: str, action: str) -> str:
    """A member acts through the queue's managers (docs/SECURITY.md)."""
    queue.ask(job_id, action)
    return f"asked the managers of {queue.path} to {action} it (they do if you submitted it)"


def _cancel(args: argparse.Namespace) -> int:
    if bool(args.jobs) == bool(args.function):
        raise UsageError("name the jobs to cancel, or give --function F for its ready and scheduled jobs (not both)")
    queue = open_queue(args)
    ids = args.jobs or [
        job.id for state in (State.READY, State.SCHEDULED) for job in queue.jobs(state, function=args.function)
    ]

    def cancel(job_id: str) -> str:
        if not queue.owned:
            return _ask(queue, job_id, "cancel")
        if queue.cancel(job_id) is State.CLAIMED:
            return "running: its manager stops it and moves it to dead/"
        return "cancelled: moved to dead/"

    return _each(ids, cancel)


def _each(ids: list[str], action: Callable[[str], str]) -> int:
    """Apply `action` to every id, reporting each; one failure does not stop the rest."""
    code = 0
    for job_id in ids:
        try:
            print(f"{job_id} {action(job_id)}")
        except JobsError as exc:
            print(f"forkvisor: {safe(exc)}", file=sys.stderr)
            code = max(code, EXIT_NOT_FOUND if not isinstance(exc, InvalidJobId) else EXIT_USAGE)
    return code


def _purge(args: argparse.Namespace) -> int:
    queue = open_queue(args)
    ids = queue.purge(args.state, args.older_than, dry_run=args.dry_run)
    if args.json:
        print_json({"purged": [] if args.dry_run else ids, "would_purge": ids if args.dry_run else []})
        return 0
    verb = "would purge" if args.dry_run else "purged"
    print(f"{verb} {len(ids)} {args.state.value} job(s) older than {format_duration(args.older_than)}")
    for job_id in ids if args.dry_run else []:
        print(job_id)
    return 0


# -- waiting ----------------------------------------------------------------------------


def _wait(args: argparse.Namespace) -> int:
    queue = open_queue(args)
    ids = _ids_from(args.jobs) if args.jobs else None  # None: every job unfinished now
    single = ids[0] if ids is not None and len(ids) == 1 else None  # a single job: its own progress
    progress = _ProgressBar(queue, single) if stderr_is_terminal() else None
    try:
        finished = queue.wait(ids, timeout=args.timeout, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    if args.json:
        print_json({job_id: found.value for job_id, found in finished.items()})
    return EXIT_JOB_DEAD if State.DEAD in finished.values() else 0


def _ids_from(names: list[str]) -> list[str]:
    if names == ["-"]:
        return [line.strip() for line in sys.stdin if line.strip()]
    if "-" in names:
        raise UsageError("- (ids from stdin) must be the only JOB argument")
    return names


class _ProgressBar:
    """One line on the terminal, redrawn in place: [#####-----] 50/100 done 48 dead 2; for a
    single job still running, what it says of its own progress (`jobs.current().progress`)."""

    WIDTH = 30

    def __init__(self, queue: Queue | None = None, job_id: str | None = None) -> None:
        self._last = ""
        self._queue, self._job_id = queue, job_id

    def __call__(self, finished: dict[str, State], pending: int) -> None:
        total = len(finished) + pending
        dead = sum(1 for state in finished.values() if state is State.DEAD)
        line = f"{self._bar(len(finished) / total if total else 1.0)} {len(finished)}/{total}"
        line += f" done {len(finished) - dead} dead {dead}"
        if pending and self._queue is not None and self._job_id is not None:
            line = self._job_line(self._queue, self._job_id) or line
        if line != self._last:
            sys.stderr.write(f"\r{line}")
            sys.stderr.flush()
            self._last = line

    def _job_line(self, queue: Queue, job_id: str) -> str:
        """The single job's own progress as a bar ("" while it says nothing)."""
        try:
            job = queue.job(job_id)
        except JobsError:
            return ""
        said = queue.serving.run_progress(job) if job.state is State.CLAIMED else None
        if not said:
            return ""
        return f"{self._bar(progress_share(said) or 0.0)} {safe(progress_text(said, time.time()))[:80]}"

    def _bar(self, share: float) -> str:
        filled = int(self.WIDTH * share)
        return f"[{'#' * filled}{'-' * (self.WIDTH - filled)}]"

    def close(self) -> None:
        if self._last:
            sys.stderr.write("\n")
