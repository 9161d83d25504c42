"""Recover a crash state with forkvisor's own tools, and check what must hold.

Each tool runs in a forked child of this process (`supervisor.cli.program.main`: the
real command, without a new interpreter per call), with a deadline: a tool that crashes
(exit 101) or hangs is a violation. Then, read straight from the folder:

- every acknowledged job is in exactly one state folder, with a readable spec;
- every run that started is counted (the counter is at least the runs whose process
  wrote into their folder, less those released uncounted);
- a done job has its result (these workloads' jobs all return one) and a finished run;
  a dead job has its reason;
- an acknowledged key is held by its job or the job has ended; an acknowledged
  dependent waits with its edge, or has moved on; an acknowledged cancel has buried its
  job once recovered.
"""

from __future__ import annotations

import json
import os
import select
import signal
from collections.abc import Sequence
from pathlib import Path

from jobs import State, is_job_id
from supervisor.cli import program  # imported once here: each tool's child starts with it
from tests.crashstate.app import RECOVERING
from tests.jobs_processes.invariants import job_ids_on_disk, read_attempts

APP = "tests.crashstate.app:registry"
TOOL_TIMEOUT = 60.0
SHOWN = 3  # acknowledged jobs shown per state (the newest: the others were shown in earlier states)
EXIT_NOT_A_QUEUE = 111  # (the tools' exit status for a folder that is not a queue, or cannot be used)


def tool(argv: Sequence[str], log: Path, timeout: float = TOOL_TIMEOUT) -> int | str:
    """Run `forkvisor ARGV` in a forked child; its exit status, or "hung" past `timeout`."""
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.environ[RECOVERING] = "1"
            code = program.main(list(argv))
        finally:
            os._exit(code)
    pidfd = os.pidfd_open(pid)
    try:
        if not select.select([pidfd], [], [], timeout)[0]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "hung"
    finally:
        os.close(pidfd)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def violations(
    queue: Path, marks: Sequence[str], log: Path, recover: bool = True, options: Sequence[str] = ()
) -> list[str]:
    """What breaks a guarantee in the crash state at `queue`, before and after recovery (by
    tools given `options` too, as the workload's own manager was)."""
    acked = _acknowledged(marks)
    reset = {words[2] for words in (mark.split() for mark in marks) if words[:2] == ["ACK", "reset"]}
    found = _places_problems(queue, acked, submitted=_submitted(queue)) + _key_and_edge_problems(queue, marks)
    found += _counter_problems(queue, reset)
    if not recover:
        return found
    # Before the queue was acknowledged (its first job), it may not be one yet: saying so is right.
    fine = (0,) if acked else (0, EXIT_NOT_A_QUEUE)
    for argv in (["status", str(queue)], ["list", str(queue)]):
        if (code := tool(argv, log)) not in fine:
            found.append(f"`forkvisor {argv[0]}` ended {code}")
    for job_id in [job_id for job_id in acked if job_id not in _purged(queue)][-SHOWN:]:
        if (code := tool(["show", str(queue), job_id], log)) != 0:
            found.append(f"`forkvisor show` of acknowledged job {job_id} ended {code}")
    burst = ["run", "--burst", "--commands", "--app", APP, "--concurrency", "2", "--log-level", "WARNING", *options]
    if (code := tool([*burst, str(queue)], log)) not in fine:
        found.append(f"`forkvisor run --burst` ended {code}")
    found += _places_problems(queue, acked) + _counter_problems(queue, reset) + _ended_problems(queue)
    return found + _cancel_problems(queue, marks)


def renumber_taken(queue: Path, renumbered: dict[int, int]) -> None:
    """Point the `taken/ID` marks ("UID INODE" of a member's submission file) at the copy's
    inode of that file, as they pointed at the recording disk's (a copy cannot keep it)."""
    for job_id in _names(queue / "taken"):
        mark = queue / "taken" / job_id
        words = mark.read_text().split()
        if len(words) == 2 and words[1].isdigit() and int(words[1]) in renumbered:
            mark.write_text(f"{words[0]} {renumbered[int(words[1])]}\n")


def _acknowledged(marks: Sequence[str]) -> list[str]:
    """Ids the workload was told of ("ACK WHAT ID [...]")."""
    found = [words[2] for words in (mark.split() for mark in marks) if len(words) >= 3 and words[0] == "ACK"]
    return [job_id for job_id in dict.fromkeys(found) if is_job_id(job_id)]


def _places_problems(queue: Path, acked: Sequence[str], submitted: frozenset[str] = frozenset()) -> list[str]:
    """Acknowledged jobs not in exactly one state folder (before recovery, a member's
    submission not taken in yet, in `submitted`, may be in none)."""
    seen: dict[str, list[str]] = {}
    for state in (State.READY, State.SCHEDULED, State.WAITING, State.DONE, State.DEAD):
        for name in _names(queue / state.value):
            job_id = name.rsplit(".", 1)[-1] if state in (State.READY, State.SCHEDULED) else name
            seen.setdefault(job_id, []).append(f"{state.value}/{name}")
    for owner in _names(queue / "claimed"):
        for name in _names(queue / "claimed" / owner):
            if not name.startswith("."):
                seen.setdefault(name, []).append(f"claimed/{owner}/{name}")
    found = []
    purged = _purged(queue)
    for job_id in acked:
        places = seen.get(job_id, [])
        if not places and (job_id in purged or job_id in submitted):
            continue  # an operator purged it, and the log says so; or it waits in incoming/
        if len(places) != 1:
            found.append(f"acknowledged job {job_id} is in {len(places)} places: {places}")
        elif not (queue / places[0] / "job.json").is_file():
            found.append(f"acknowledged job {job_id} has no job.json in {places[0]}")
    for job_id, places in seen.items():
        if len(places) > 1 and job_id not in acked:
            found.append(f"job {job_id} is in {len(places)} places: {places}")
    return found


def _submitted(queue: Path) -> frozenset[str]:
    """Ids of the members' submissions in incoming/ (`ID.json`, or `.taking.ID.json` mid take-in)."""
    found = set()
    for member in _names(queue / "incoming"):
        for name in _names(queue / "incoming" / member):
            if name.endswith(".json"):
                found.add(name.removeprefix(".taking.").removesuffix(".json"))
    return frozenset(found)


def _cancel_problems(queue: Path, marks: Sequence[str]) -> list[str]:
    """Jobs whose cancel was acknowledged and that are not dead once recovered."""
    cancelled = [words[2] for words in (mark.split() for mark in marks) if words[:2] == ["ACK", "cancel"]]
    return [f"cancelled job {job_id} is not in dead/" for job_id in cancelled if not (queue / "dead" / job_id).is_dir()]


def _purged(queue: Path) -> set[str]:
    try:
        return {line.split()[-1] for line in (queue / "purged.log").read_text().splitlines() if line.split()}
    except OSError:
        return set()


def _counter_problems(queue: Path, reset: set[str]) -> list[str]:
    """Runs started and not counted (but in jobs whose counter an operator reset: `reset`)."""
    found = []
    for job_dir in _job_dirs(queue):
        if job_dir.name.rsplit(".", 1)[-1] in reset:
            continue
        started = released = 0
        for run in job_dir.glob("attempt-*"):
            if any((run / name).exists() for name in ("pid", "stdout", "result.json")):
                started += 1
                outcome = _json(run / "outcome.json")
                released += bool(isinstance(outcome, dict) and outcome.get("released"))
        try:
            counted = read_attempts(job_dir)
        except AssertionError as exc:
            found.append(str(exc))
            continue
        if counted < started - released:
            found.append(f"{job_dir.name}: {started} runs started ({released} released), counter says {counted}")
    return found


def _ended_problems(queue: Path) -> list[str]:
    found = []
    for job_dir in (queue / "done").iterdir() if (queue / "done").is_dir() else ():
        spec = _json(job_dir / "job.json")
        if isinstance(spec, dict) and spec.get("function") == "forkvisor.command":
            continue  # a command's result is its output
        if not (job_dir / "result.json").is_file():
            found.append(f"done job {job_dir.name} has no result.json")
        runs = sorted(job_dir.glob("attempt-*"), key=lambda path: int(path.name.split("-")[1]))
        if not runs or not (runs[-1] / "outcome.json").is_file():
            found.append(f"done job {job_dir.name} has no finished run")
    for job_dir in (queue / "dead").iterdir() if (queue / "dead").is_dir() else ():
        if not (job_dir / "error.json").is_file():
            found.append(f"dead job {job_dir.name} has no error.json")
    return found


def _key_and_edge_problems(queue: Path, marks: Sequence[str]) -> list[str]:
    live = job_ids_on_disk(queue) - set(_names(queue / "done")) - set(_names(queue / "dead"))
    found = []
    for words in (mark.split() for mark in marks):
        if len(words) == 4 and words[1] == "keyed" and words[2] in live:
            generations = [name for name in _names(queue / "keys" / words[3]) if not name.startswith(".")]
            holders = [(queue / "keys" / words[3] / name).read_text().strip() for name in generations]
            if words[2] not in holders:
                found.append(f"key {words[3]} of live job {words[2]} is held by none of its generations")
        waiting = len(words) == 4 and words[1] == "dependent" and (queue / "waiting" / words[2]).is_dir()
        if waiting and words[3] in live and not (queue / "edges" / words[3] / words[2]).exists():
            found.append(f"waiting job {words[2]} has no edge from its live parent {words[3]}")
    return found


def _job_dirs(queue: Path) -> list[Path]:
    dirs = [queue / state / name for state in ("done", "dead", "waiting") for name in _names(queue / state)]
    dirs += [queue / state / name for state in ("ready", "scheduled") for name in _names(queue / state)]
    for owner in _names(queue / "claimed"):
        dirs += [
            queue / "claimed" / owner / name for name in _names(queue / "claimed" / owner) if not name.startswith(".")
        ]
    return [path for path in dirs if path.is_dir() and not path.is_symlink()]


def _names(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _json(path: Path) -> object:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
