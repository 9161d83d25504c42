"""Commands that read a queue: status, list, show, logs."""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from jobs import COMMAND, Job, NotFinished, Policy, Queue, State, format_duration, format_size, output
from supervisor import snapshot
from supervisor.cli.common import (
    Commands,
    Parser,
    UsageError,
    add_command,
    add_queue,
    ago,
    megabytes,
    open_queue,
    positive_duration,
    print_json,
    progress_text,
    state,
    when,
)
from supervisor.cli.text import safe, safe_lines

MAX_EVENTS_BYTES = 1 << 20
FOLLOW_POLL = 0.2


def add_commands(commands: Commands[Parser]) -> None:
    status = add_command(commands, "status", _status, "counts, managers and running jobs of a queue")
    add_queue(status)
    status.add_argument("--json", action="store_true", help="one JSON document (one per refresh with --watch)")
    status.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    status.add_argument("--interval", type=positive_duration, default=1.0, help="--watch refresh period (1s)")

    listing = add_command(commands, "list", _list, "list jobs, in claim order within each state")
    add_queue(listing)
    listing.add_argument("--state", type=state, help="ready, scheduled, claimed, done or dead (default: all)")
    listing.add_argument("--function", metavar="F", help="only jobs of this function (forkvisor.command: commands)")
    listing.add_argument("--limit", type=int, default=100, metavar="N", help="at most N jobs (0: all; default 100)")
    listing.add_argument(
        "--after", metavar="ENTRY", help="the next page: jobs after this entry of --state (the last page's last)"
    )
    listing.add_argument("--json", action="store_true")

    show = add_command(commands, "show", _show, "one job: spec, state, every attempt, error, result, events")
    add_queue(show)
    show.add_argument("job", metavar="JOB")
    show.add_argument("--json", action="store_true")

    logs = add_command(commands, "logs", _logs, "print a job attempt's stdout (or stderr)")
    add_queue(logs)
    logs.add_argument("job", metavar="JOB")
    logs.add_argument("--attempt", type=int, metavar="N", help="which run (default: the last)")
    logs.add_argument("--stderr", action="store_true", help="stderr instead of stdout")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing while the attempt runs")
    logs.add_argument("--raw", action="store_true", help="the bytes as they are, even to a terminal")


# -- status -------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    queue = open_queue(args)
    refresh = sys.stdout.isatty() and not args.json
    while True:
        taken = snapshot.take(queue)
        if args.json:
            print_json(taken.to_json())
        else:
            # Fields from the queue (hosts, functions, names) are escaped as the lines are made,
            # so that a newline in one cannot forge a line; each line is escaped once more.
            text = "\n".join(safe(line) for line in _status_text(taken).splitlines())
            print(f"\033[H\033[J{text}" if args.watch and refresh else text, flush=True)
        if not args.watch:
            return 0
        time.sleep(args.interval)  # a display refresh, not a wait for a condition
        if not refresh and not args.json:
            print()


def _status_text(taken: snapshot.Snapshot) -> str:
    counts = "  ".join(f"{name} {number}" for name, number in taken.counts.items())
    waiting = "none ready" if taken.oldest_ready_age is None else ago(taken.oldest_ready_age)
    lines = [f"queue {taken.queue}", counts, f"oldest ready job waiting: {waiting}"]
    if taken.paused:
        lines.append(f"PAUSED: {safe(taken.paused)} (`forkvisor resume` undoes it)")
    lines.append("")
    lines.append(f"managers ({len(taken.managers)}):" if taken.managers else "managers: none")
    for manager in taken.managers:
        state_note = " reaping" if manager.reaping else (" DEAD" if manager.alive is False else "")
        busy = f"  busy {manager.busy}/{manager.concurrency}" if manager.concurrency else ""
        lines.append(
            f"  {manager.owner}  host {safe(manager.host)} pid {manager.pid}{busy}"
            f"  heartbeat {ago(manager.heartbeat_age)} ago (lease {format_duration(manager.lease)}){state_note}"
        )
        lines.append(f"    runs {safe(_functions(manager.functions))}")
        if manager.containment:
            lines.append(f"    contains its runs by {safe(manager.containment)}")
        lines += _skipped_lines(manager)
    lines += _unserved_lines(taken)
    lines.append(f"running ({len(taken.running)}):" if taken.running else "running: none")
    now = time.time()
    for job in taken.running:
        lines.append(
            f"  {job.id}  {safe(job.what)[:40]}  attempt {job.attempt}/{job.max_attempts}  age {ago(job.age)}"
            f"  pid {job.pid or '-'}  cpu {'-' if job.cpu is None else f'{job.cpu:.2f}s'}  rss {megabytes(job.rss)}"
        )
        if job.progress:
            lines.append(f"    progress {safe(progress_text(job.progress, now))[:120]}")
    return "\n".join(lines)


def _skipped_lines(manager: snapshot.ManagerInfo, shown: int = 5) -> list[str]:
    """What a manager (claims) and its sweeper (sweep) skip: entries they cannot read, move
    or parse, which stay where they are until someone fixes or removes them."""
    if not manager.skipped_count:
        return []
    lines = [f"    skips {manager.skipped_count} entr{'y' if manager.skipped_count == 1 else 'ies'} it cannot handle:"]
    found = [(source, where, why) for source, entries in manager.skipped.items() for where, why in entries.items()]
    lines += [f"      {source}: {safe(where)}: {safe(why)}" for source, where, why in found[:shown]]
    if manager.skipped_count > shown:
        lines.append("      ... (the manager's log names every one)")
    return lines


def _functions(functions: list[str] | None, shown: int = 8) -> str:
    if functions is None:
        return "? (an older forkvisor: it does not say)"
    if not functions:
        return "nothing"
    more = f" and {len(functions) - shown} more" if len(functions) > shown else ""
    return ", ".join(functions[:shown]) + more


def _unserved_lines(taken: snapshot.Snapshot) -> list[str]:
    unserved = taken.unserved
    if not unserved.known:
        return ["ready jobs no running manager runs: cannot tell (a manager does not say what it runs)"]
    if not unserved.count:
        return []
    among = "" if unserved.checked < snapshot.UNSERVED_SCAN else f" among the first {unserved.checked} in claim order"
    named = ", ".join(f"{safe(name)} ({count})" for name, count in sorted(unserved.functions.items()))
    why = "no manager is running" if not taken.managers else "deploy a manager that runs them, or cancel them"
    return [f"ready jobs no running manager runs: {unserved.count}{among}: {named}; {why}"]


# -- list ---------------------------------------------------------------------------------


def _list(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise UsageError(f"--limit must be 0 (all) or more, got {args.limit}")
    if args.after is not None and args.state is None:
        raise UsageError("--after pages through one state: give --state too")
    queue = open_queue(args)
    found = queue.jobs(args.state, function=args.function, limit=args.limit or None, after=args.after)
    served = snapshot.served(queue)
    if args.json:
        print_json([snapshot.job_summary(job, snapshot.policy_of(queue, job, served)) for job in found])
        return 0
    width = min(40, max((len(snapshot.describe(job)) for job in found), default=8))
    for job in found:
        tries = f"{job.attempts}/{snapshot.policy_of(queue, job, served).max_attempts}"
        what = safe(snapshot.describe(job))[:width]
        print(f"{job.id}  {job.state.value:<9} {what:<{width}}  {tries}  {safe(_detail(job))}")
    if args.limit and len(found) == args.limit and sys.stderr.isatty():
        page = f"next page: --after {safe(found[-1].path.name)}; " if args.state else ""
        print(f"(the first {args.limit}; {page}--limit 0 lists all)", file=sys.stderr)
    return 0


def _detail(job: Job) -> str:
    if job.state is State.DEAD:
        return str((job.error or {}).get("message", ""))[:100]
    if job.state is State.DONE:
        return f"result {_short(job.result)}"
    if job.state is State.CLAIMED:
        return f"by {job.owner}"
    if job.state is State.SCHEDULED and job.history:
        return "retry pending"
    return ""


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- show ---------------------------------------------------------------------------------


def _show(args: argparse.Namespace) -> int:
    queue = open_queue(args)
    job = queue.job(args.job)
    events = queue.events(job.id, MAX_EVENTS_BYTES)
    served = snapshot.served(queue)
    policy = snapshot.policy_of(queue, job, served)
    progress = queue.serving.run_progress(job) if job.state is State.CLAIMED else None
    if args.json:
        print_json({**snapshot.job_document(job, policy, events), "progress": progress})
        return 0
    for line in _show_lines(job, policy, events, served, progress):
        print(safe(line))  # every field a job or a member could write is escaped
    return 0


def _show_lines(
    job: Job, policy: Policy, events: list[str], served: dict[str, Any], progress: dict[str, Any] | None = None
) -> list[str]:
    spec = job.spec
    held = f" (held by {job.owner})" if job.owner else ""
    lines = [f"job       {job.id}", f"state     {job.state.value}{held}"]
    if spec.function == COMMAND:
        lines.append(f"command   {snapshot.describe(job)[2:]}")
    else:
        lines += [f"function  {spec.function}", f"args      {_short(list(spec.args), 200)}"]
    if spec.kwargs:
        lines.append(f"kwargs    {_short(dict(spec.kwargs), 200)}")
    lines += [
        f"attempts  {job.attempts}/{policy.max_attempts}   priority {spec.priority}",
        f"policy    {_policy_text(policy)}",
    ]
    if not job.state.terminal and job.policy is None and job.function not in served:
        lines.append("          (no running manager runs this function: its own policy is not known here)")
    lines.append(f"created   {when(job.created)}")
    if spec.metadata:
        lines.append(f"metadata  {_short(dict(spec.metadata), 200)}")
    if spec.key is not None:
        lines.append(f"key       {spec.key}")
    if spec.depends_on:
        failure = "  (runs even if one is dead)" if spec.allow_failure else ""
        lines.append(f"after     {' '.join(spec.depends_on)}{failure}")
    if job.state is State.DONE:
        lines.append(f"result    {_short(job.result, 500)}")
    if job.error:
        lines.append(f"error     {job.error.get('reason', '')}: {job.error.get('message', '')}")
    for attempt in job.history:
        lines += _attempt_lines(attempt.number, attempt.outcome)
    if progress:
        lines.append(f"progress  {progress_text(progress, time.time())} (run {job.history[-1].number})")
    if job.frozen:
        lines.append(f"FROZEN    run {job.history[-1].number}, by an operator (`forkvisor resume QUEUE --job ID`)")
    return [*lines, "events:", *(f"  {line}" for line in events)]


def _attempt_lines(number: int, outcome: Any) -> list[str]:
    """One line for a run, and one for its error if it recorded one."""
    if not isinstance(outcome, dict):
        return [f"run {number}: running (or never harvested)"]
    status = "did not start" if outcome.get("started") is False else outcome.get("status", "?")
    line = f"run {number}: {status}"
    if outcome.get("limit"):
        line += f" at its {outcome['limit']} limit"
    if "wall_time" in outcome:
        cpu = [outcome.get(name) or 0 for name in ("cpu_user", "cpu_system")]
        cpu_time = sum(cpu) if all(_amount(part) is not None for part in cpu) else None
        line += f", {_shown(outcome['wall_time'], 's wall')}, {_shown(cpu_time, 's cpu')}"
        line += f", max rss {_shown(outcome.get('max_rss_kb') or 0, 'M', 1024, 1)}"
        line += f", pid {outcome.get('pid')} on {outcome.get('host')}"
    if outcome.get("released"):
        line += " (released: attempt not counted)"
    lines = [line, *_cost_lines(outcome.get("cost")), *_dropped_lines(outcome.get("output_dropped"))]
    error = outcome.get("error")
    if isinstance(error, dict) and error.get("message"):
        lines.append(f"    {error.get('type', 'error')}: {error['message']}")
    return lines


def _cost_lines(cost: object) -> list[str]:
    """What the whole run used: from its cgroup (every process it started), or from wait4."""
    if not isinstance(cost, dict) or cost.get("from") != "cgroup":
        return []  # (from wait4: the line above has it)
    cpu = f"{_shown(cost.get('cpu_user'), 's user')}, {_shown(cost.get('cpu_system'), 's system')}"
    line = f"    all its processes: {cpu}"
    peak = _amount(cost.get("peak_memory"))
    if peak is not None:
        line += f", peak memory {format_size(int(peak))} of its own"  # (what it shares with the manager is not)
    seen = _amount(cost.get("processes_seen"))
    if seen:
        line += f", {seen:.0f} process{'' if seen == 1 else 'es'} seen (at least)"
    kills = _amount(cost.get("oom_kills"))
    if kills:
        line += f", {kills:.0f} killed by the kernel at the memory limit"
    return [line]


def _dropped_lines(dropped: object) -> list[str]:
    """What the run's output limit dropped, by file (`forkvisor logs` shows the head and tail)."""
    if not isinstance(dropped, dict):
        return []
    return [
        f"    {name}: {_shown(dropped.get(name), ' bytes', digits=0)} dropped from its middle (its output limit)"
        for name in output.OUTPUT_FILES
        if dropped.get(name)
    ]


def _amount(value: object) -> float | None:
    """A number of a run's record that a float holds, else None (the record is data, and a
    job run as its submitter could have written its own before the manager's replaced it)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not abs(value) <= 1e300:
        return None
    return float(value)


def _shown(value: object, unit: str, scale: float = 1.0, digits: int = 3) -> str:
    amount = _amount(value)
    return f"?{unit}" if amount is None else f"{amount / scale:.{digits}f}{unit}"


def _policy_text(policy: Policy) -> str:
    shown = {
        "max_attempts": str(policy.max_attempts),
        "timeout": format_duration(policy.timeout),
        "memory_limit": format_size(policy.memory_limit),
        "output_limit": format_size(policy.output_limit),
        "backoff": policy.backoff,
    }
    return "  ".join(f"{name} {value} ({policy.sources[name]})" for name, value in shown.items())


# -- logs ---------------------------------------------------------------------------------


def _logs(args: argparse.Namespace) -> int:
    queue = open_queue(args)
    job = queue.job(args.job)
    if not job.history:
        raise NotFinished(f"job {job.id} has not run yet (it is {job.state.value}): it has no logs")
    runs = {attempt.number: attempt for attempt in job.history}
    number = args.attempt if args.attempt is not None else max(runs)
    if number not in runs:
        raise UsageError(f"job {job.id} has no run {number}; its runs are {', '.join(map(str, sorted(runs)))}")
    name = "stderr" if args.stderr else "stdout"
    write = _write_raw if args.raw or not sys.stdout.isatty() else _write_escaped
    opened = queue.open_output(job.id, number, name)
    if opened is None:
        return 0  # the run wrote nothing there (or had not started)
    with opened as log:  # the descriptor follows the file when the job moves
        if not stat.S_ISREG(os.fstat(log.fileno()).st_mode):
            raise UsageError(f"{name} of job {job.id} run {number} is not a regular file: nothing to show")
        _copy(log, write, name)
        if args.follow:
            _follow(queue, job.id, number, log, write, name)
    return 0


def _write_raw(chunk: bytes) -> None:
    sys.stdout.buffer.write(chunk)


def _write_escaped(chunk: bytes) -> None:
    """On a terminal, a job's output could hold escape sequences: show them as text."""
    sys.stdout.write(safe_lines(chunk.decode("utf-8", "replace")))


def _follow(queue: Queue, job_id: str, run: int, log: BinaryIO, write: Callable[[bytes], None], name: str) -> None:
    """Keep copying until the run is harvested (its outcome.json appears) or the job leaves claimed/."""
    while True:
        job = queue.job(job_id)
        harvested = any(attempt.number == run and attempt.outcome is not None for attempt in job.history)
        if job.state is not State.CLAIMED or harvested:
            _copy(log, write, name)
            return
        if not _copy(log, write, name):
            time.sleep(FOLLOW_POLL)  # `tail -f` polls too; a log has no end to wait for


def _copy(log: BinaryIO, write: Callable[[bytes], None], name: str) -> bool:
    """Copy what is new in `log` to stdout; whether there was anything. The middle of a
    running job's output past its limit is a hole (`jobs.output`): one line says so."""
    copied = False
    while True:
        at = log.tell()
        start, end = output.data_after(log.fileno(), at)
        if start >= end:
            break
        if start > at:
            write(output.dropped_line(name, start - at))
        log.seek(start)
        while (left := end - log.tell()) > 0 and (chunk := log.read(min(left, 1 << 20))):
            write(chunk)
        copied = True
    if copied:
        sys.stdout.flush()
        sys.stdout.buffer.flush()
    return copied
