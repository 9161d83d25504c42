"""From a reaped child to a recorded outcome and the job's next state.

Every attempt's `outcome.json` answers "why did it die": exit code or signal
name, the limit hit if any, max RSS, CPU and wall time, host and pid, the
error and traceback the child recorded, and the tail of its stderr.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
from collections.abc import Iterator
from typing import Any

from jobs import COMMAND, Claim, RunEnd, format_size, output, run_folder
from supervisor.forking import EXIT_CANNOT_COMPLETE, EXIT_CHILD_ERROR, EXIT_OK, EXIT_ORPHANED, ExitStatus
from supervisor.running import Running, Stop

STDERR_TAIL_BYTES = 4096
log = logging.getLogger(__name__)


def run_end(running: Running, status: ExitStatus, now_wall: float, run: int | None = None) -> RunEnd:
    """How the run ended, decoded once: its exit, why its manager stopped it, its outcome
    record; the store decides from it where the job goes (`queue.serving.finish`). `run`:
    the run's folder (`open_run`), if the caller opened it; else it is opened here."""
    if run is not None:
        return _end(running, status, now_wall, run)
    with _opened(running.claim) as opened:
        return _end(running, status, now_wall, opened)


def _end(running: Running, status: ExitStatus, now_wall: float, run: int | None) -> RunEnd:
    outcome = _outcome(running, status, now_wall, run)
    outcome["output_dropped"] = _compacted(running, run)
    # Whether it returned matters only for a run a drain stopped after it exited 0.
    returned = status.code == EXIT_OK and running.stopped is Stop.DRAIN and _has_result(run)
    return RunEnd(
        exited_ok=status.code == EXIT_OK,
        stop=running.stopped.value if running.stopped else None,
        has_result=returned,
        cannot_complete=status.code == EXIT_CANNOT_COMPLETE,
        error=outcome["error"] or {"message": status.describe()},
        outcome=outcome,
    )


def _has_result(run: int | None) -> bool:
    return run is not None and run_folder.has_result(run)


def _compacted(running: Running, run: int | None) -> dict[str, int]:
    """Bound the run's output to its limit, head and tail; the bytes dropped, by file."""
    limit = running.claim.policy.output_limit
    if run is None or not limit:
        return {}
    try:
        return output.compact(run, limit)
    except OSError as exc:  # a full disk, say: the output stays whole, the outcome is recorded
        log.warning("job %s: could not bound its output: %s", running.claim.job_id, exc)
        return {}


def open_run(claim: Claim) -> int | None:
    """The run's folder's descriptor, the caller's to close; None if it is gone (claim lost)."""
    try:
        return run_folder.open_run(claim.place, claim.run)
    except OSError:
        return None


@contextlib.contextmanager
def _opened(claim: Claim) -> Iterator[int | None]:
    run = open_run(claim)
    try:
        yield run
    finally:
        if run is not None:
            os.close(run)


def _outcome(running: Running, status: ExitStatus, now_wall: float, run: int | None) -> dict[str, Any]:
    usage = status.rusage
    return {
        "run": running.claim.run,
        "attempt": running.claim.attempt,
        "max_attempts": running.claim.policy.max_attempts,
        "status": status.describe(),
        "exit_code": status.code,
        "signal": status.signal.name if status.signal else None,
        "limit": running.stopped.value if running.stopped else None,
        "released": None,  # the verdict's (`RunEnd.record`)
        "succeeded": None,
        "host": host_name(),
        "pid": status.pid,
        "started": running.started_wall,
        "ended": now_wall,
        "wall_time": round(now_wall - running.started_wall, 6),
        "cpu_user": round(usage.ru_utime, 6),
        "cpu_system": round(usage.ru_stime, 6),
        "max_rss_kb": usage.ru_maxrss,
        "cost": running.cost or _cost_of(usage),
        "error": _recorded_error(status, run) or limit_error(running, status),
        "stderr_tail": stderr_tail(run),
    }


def _cost_of(usage: Any) -> dict[str, Any]:
    """What a run used where it had no cgroup: its process's, and of the descendants that
    process waited for (the kernel adds theirs to its own at each wait)."""
    return {
        "cpu_user": round(usage.ru_utime, 6),
        "cpu_system": round(usage.ru_stime, 6),
        "peak_memory": usage.ru_maxrss * 1024,  # of its largest process, not of the tree at once
        "oom_kills": None,
        "from": "wait4",
    }


@functools.cache
def host_name() -> str:
    """This host's name, read once: the manager's owner name carries it from its start too."""
    return socket.gethostname()


def _recorded_error(status: ExitStatus, run: int | None) -> dict[str, Any] | None:
    """The error the child recorded; a child that exited 0 recorded none (see `child`)."""
    return None if status.code == EXIT_OK or run is None else run_folder.read_error(run)


def limit_error(running: Running, status: ExitStatus) -> dict[str, Any] | None:
    """An error message for an attempt that died without recording one itself."""
    spec, policy = running.claim.spec, running.claim.policy
    if running.stopped is Stop.TIMEOUT:
        return {"type": "Timeout", "message": f"ran past its timeout of {policy.timeout or 0:g}s; {status.describe()}"}
    if running.stopped is Stop.MEMORY:
        limit, peak = format_size(policy.memory_limit), (running.cost or {}).get("peak_memory")
        if peak is not None:  # the kernel's limit, and its count of the peak
            return {"type": "MemoryLimit", "message": f"killed: memory limit {limit}, peak {format_size(peak)}"}
        return {"type": "MemoryLimit", "message": f"used more than {limit} RSS; {status.describe()}"}
    if running.stopped is Stop.OUTPUT:  # where holes cannot be punched (`limits.bound_output`)
        ceiling, limit = format_size(output.ceiling(policy.output_limit or 0)), format_size(policy.output_limit)
        why = f"wrote more than {ceiling} to one stream, where output_limit {limit} cannot be held as it runs"
        return {"type": "OutputLimit", "message": f"{why}; {status.describe()}"}
    if running.stopped is Stop.CANCELLED:
        return {"type": "Cancelled", "message": f"cancelled by an operator; {status.describe()}"}
    if running.stopped is Stop.DRAIN:
        return {"type": "Released", "message": f"stopped by the manager's shutdown; {status.describe()}"}
    if status.code == EXIT_OK:
        return None
    if spec.function == COMMAND:  # the program's own exit status, whatever its value
        return command_error(spec.args[0] if spec.args else "?", status)
    if status.code == EXIT_CHILD_ERROR:
        return {
            "type": "ChildError",
            "message": "forkvisor failed inside the child before or after the job; see stderr",
        }
    if status.code == EXIT_ORPHANED:
        why = "the child found its manager dead or its claim taken back before the job started"
        return {"type": "Orphaned", "message": why}
    return {"type": "Crashed", "message": f"the job's process {status.describe()} without recording an error"}


def command_error(program: object, status: ExitStatus) -> dict[str, Any]:
    """Why a command job failed, from its exit status alone. 127 and 126 are what a shell
    (and the spawned job's own, see `spawner`) says for a program it cannot find or run."""
    if status.code in CANNOT_RUN:
        why = CANNOT_RUN[status.code]
        return {"type": "CannotRun", "message": f"cannot run {program!r}? it exited {status.code}: {why}"}
    return {"type": "CommandFailed", "message": f"the command {status.describe()}; see its stderr"}


CANNOT_RUN = {
    127: "command not found (it, or one it ran); see its stderr",
    126: "not executable, or its folder cannot be entered (it, or one it ran); see its stderr",
}


def stderr_tail(run: int | None) -> str:
    """The last bytes of the attempt's stderr."""
    return "" if run is None else run_folder.tail(run, "stderr", STDERR_TAIL_BYTES)
