"""`forkvisor schedule add|list|show|remove|pause|resume`: periodic jobs kept in the queue.

A schedule added here is a file in the queue folder (`schedules/NAME.json`), so every
manager of the queue, on every host, fires it, exactly once per tick.
"""

from __future__ import annotations

import argparse
import os
import shlex
from datetime import UTC, datetime
from typing import Any

from jobs import (
    COMMAND,
    DEFAULT_MISSED,
    MISSED,
    SCHEDULE_CAP,
    Call,
    JobOptions,
    Schedule,
    ScheduleInfo,
    Timing,
    command_call,
)
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
    print_json,
)
from supervisor.cli.text import safe


def add_commands(commands: Commands[Parser]) -> None:
    group = commands.add_parser(
        "schedule", help="periodic jobs: add, list, show, remove, pause, resume", description=__doc__
    )
    actions = group.add_subparsers(required=True, metavar="ACTION", parser_class=Parser)

    add = add_command(actions, "add", _add, "add a schedule: its job runs at every tick, once across all managers")
    add_queue(add)
    add.add_argument("name", metavar="NAME", help="the schedule's name (letters, digits, _.:@+=-)")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help='five cron fields, e.g. "0 3 * * *", or @daily, @hourly...')
    when.add_argument("--every", metavar="DURATION", help="a fixed interval, e.g. 30s, 5m (whole seconds)")
    add.add_argument("--tz", metavar="ZONE", help="the cron expression's time zone, e.g. Europe/Paris (default UTC)")
    add.add_argument(
        "--missed",
        choices=MISSED,
        default=DEFAULT_MISSED,
        help="ticks that passed while no manager ran: skip them, run once (default), or all (up to --cap)",
    )
    add.add_argument(
        "--cap", type=int, default=SCHEDULE_CAP, metavar="N", help="the most missed ticks --missed all runs"
    )
    add.add_argument("--replace", action="store_true", help="replace a schedule of that name")
    add.add_argument("--function", metavar="FUNCTION", help="run a registered function, not a command")
    add.add_argument("--args", type=json_value, default=[], metavar="JSON", help="--function's arguments: a JSON array")
    add.add_argument("--kwargs", type=json_value, default={}, metavar="JSON", help="--function's keyword arguments")
    add.add_argument("--cwd", help="the command's folder (default: the current folder)")
    add.add_argument("--env", type=key_value, action="append", default=[], metavar="KEY=VALUE")
    add.add_argument("argv", nargs="*", metavar="-- COMMAND [ARGS...]", help="the command each tick runs")
    add_job_options(add)

    listing = add_command(actions, "list", _list, "the schedules: next tick, last tick's job and its state")
    add_queue(listing)
    listing.add_argument("--json", action="store_true", help="one JSON object per schedule")

    show = add_command(actions, "show", _show, "one schedule, whole")
    add_queue(show)
    show.add_argument("name", metavar="NAME")
    show.add_argument("--json", action="store_true")

    for name, handler, text in (
        ("remove", _remove, "remove a schedule (its job's runs stay)"),
        ("pause", _pause, "fire no tick of a schedule until it is resumed (ticks passing meanwhile are skipped)"),
        ("resume", _resume, "fire a paused schedule again"),
    ):
        action = add_command(actions, name, handler, text)
        add_queue(action)
        action.add_argument("name", metavar="NAME")


def _add(args: argparse.Namespace) -> int:
    call = _call(args)
    timing = Timing(args.cron if args.cron is not None else f"every {args.every}", args.tz)
    schedule = Schedule(
        name=args.name,
        timing=timing,
        function=str(call.fn),
        args=call.args,
        kwargs=call.kwargs,
        options=call.options or JobOptions(),
        missed=args.missed,
        cap=args.cap,
        created=datetime.now(UTC).timestamp(),
    )
    queue = open_queue(args)
    queue.add_schedule(schedule, replace=args.replace)
    _print_info(queue.schedule(schedule.name))
    return 0


def _call(args: argparse.Namespace) -> Call:
    """What each tick runs: `--function` with its arguments, or the command after --."""
    options = job_options(args)
    if args.function is not None:
        if args.argv:
            raise UsageError("give --function or a command after --, not both")
        if not isinstance(args.args, list) or not isinstance(args.kwargs, dict):
            raise UsageError("--args is a JSON array and --kwargs a JSON object")
        return Call(args.function, tuple(args.args), args.kwargs, options)
    if not args.argv:
        raise UsageError("nothing to run: write the command after --, or give --function NAME")
    cwd = os.path.abspath(args.cwd) if args.cwd is not None else os.getcwd()
    return command_call(args.argv, cwd=cwd, env=dict(args.env), options=options)


def _list(args: argparse.Namespace) -> int:
    found = open_queue(args).schedules()
    if args.json:
        for info in found:
            print_json(_document(info))
        return 0
    if not found:
        print("no schedules (add one with `forkvisor schedule add`, or declare one with @registry.periodic)")
        return 0
    rows = [("NAME", "WHEN", "NEXT", "LAST TICK", "JOB", "STATE")]
    for info in found:
        rows.append(
            (
                safe(info.schedule.name),
                safe(info.schedule.timing.describe()),
                "paused" if info.paused else _time(info.next_tick, info),
                _time(info.last_tick, info),
                info.last_job or "-",
                info.last_state.value if info.last_state else "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def _show(args: argparse.Namespace) -> int:
    info = open_queue(args).schedule(args.name)
    if args.json:
        print_json(_document(info))
    else:
        _print_info(info)
    return 0


def _print_info(info: ScheduleInfo) -> None:
    schedule = info.schedule
    job = schedule.to_json()["job"]
    what = shlex.join(map(str, schedule.args)) if job["function"] == COMMAND else job["function"]
    lines = [
        ("schedule", schedule.name),
        ("from", "the queue folder" if schedule.source == "shell" else "a Python registry"),
        ("when", schedule.timing.describe()),
        ("runs", what),
        ("missed ticks", schedule.missed + (f" (at most {schedule.cap})" if schedule.missed == "all" else "")),
        ("next tick", "paused" if info.paused else _time(info.next_tick, info)),
        ("last tick", _time(info.last_tick, info)),
        (
            "last job",
            f"{info.last_job} ({info.last_state.value if info.last_state else 'gone'})" if info.last_job else "-",
        ),
    ]
    for label, value in lines:
        print(f"{label + ':':<14}{safe(value)}")


def _last_job(info: ScheduleInfo) -> str:
    if info.last_job is None:
        return "-"
    return f"{info.last_job} ({info.last_state.value if info.last_state else 'purged'})"


def _document(info: ScheduleInfo) -> dict[str, Any]:
    return {
        **info.schedule.to_json(),
        "source": info.schedule.source,
        "paused": info.paused,
        "next_tick": info.next_tick,
        "last_tick": info.last_tick,
        "last_job": info.last_job,
        "last_state": info.last_state.value if info.last_state else None,
    }


def _time(epoch: float | None, info: ScheduleInfo) -> str:
    """A tick in the schedule's own time zone, with its offset (UTC for intervals)."""
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, info.schedule.timing.zone).strftime("%Y-%m-%d %H:%M:%S%z")


def _remove(args: argparse.Namespace) -> int:
    open_queue(args).remove_schedule(args.name)
    return 0


def _pause(args: argparse.Namespace) -> int:
    open_queue(args).pause_schedule(args.name)
    return 0


def _resume(args: argparse.Namespace) -> int:
    open_queue(args).pause_schedule(args.name, paused=False)
    return 0
