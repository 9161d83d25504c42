"""A run's folder, `attempt-N`: what the job's child writes there, and what the manager
and `forkvisor status` read back.

    pid           the child's pid, written first thing (for `status`)
    stdout stderr its output, appended as it runs
    result.json   the return value, written whole (and fsynced when durable) or not at all
    error.json    the exception the job raised, with its traceback (written by replacement:
                  never torn)
    policy.json   the policy the run started under (written by the claim)
    outcome.json  how it ended (written by the manager)

Everything goes through the folder's descriptor, opened below the queue's handles one
name at a time without following a link. The child's side takes and returns plain
descriptors and bytes: every object a child makes costs it copy-on-write faults, which
are most of a short job's overhead (docs/PERFORMANCE.md). What the manager reads is
read as any file of the queue: the job could have put a link, a fifo or a deep
document in its place.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple, TypeGuard

from jobs import document, files
from jobs.errors import InvalidJob
from jobs.handles import Entry, open_below
from jobs.output import OUTPUT_FILES as OUTPUT_FILES  # the child opens them here
from jobs.units import LATEST_MOMENT

RESULT_FILE = "result.json"
ERROR_FILE = "error.json"
PID_FILE = "pid"
PROGRESS_FILE = "progress.json"  # what the job says of its progress (`jobs.current().progress`)
MAX_PROGRESS_BYTES = 4096
MAX_MESSAGE = 500  # characters of a progress message kept
MAX_ERROR_BYTES = 1 << 20  # error.json with its traceback
_OUTPUT = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_run(place: Entry, run: int) -> int:
    """The descriptor of run `run`'s folder in the job at `place` (a claim's); FileNotFoundError
    if it is gone (the claim was taken back). The caller closes it."""
    return open_below(place.dir.fd, f"{place.name}/attempt-{run}")


# -- the child's side ---------------------------------------------------------------


def open_output(run: int, name: str, mode: int) -> int:
    """Open (append) the run's `stdout` or `stderr`, with the queue's file mode whatever the umask."""
    fd = os.open(name, _OUTPUT, mode, dir_fd=run)
    if mode & 0o077:
        os.fchmod(fd, mode)  # a shared queue's group bits
    return fd


def write_pid(run: int, mode: int, pid: int | None = None) -> None:
    """Write the run's pid (this process's, unless the manager writes a spawned child's)."""
    files.write_new(PID_FILE, f"{pid or os.getpid()}\n".encode(), durable=False, mode=mode, dir_fd=run)


def write_result(run: int, data: bytes, durable: bool, mode: int) -> None:
    """Write `result.json`; on failure (a full disk) none is left: a torn result never completes a job.
    Durable: its data and its name in the run folder (the manager makes the job folder's link
    to it durable before the job moves to `done/`)."""
    try:
        files.write_new(RESULT_FILE, data, durable=durable, mode=mode, dir_fd=run)
        if durable:
            os.fsync(run)
    except OSError:
        files.unlink_if_there(RESULT_FILE, run)
        raise


def write_error(run: int, data: bytes, mode: int) -> None:
    files.replace_file(ERROR_FILE, data, durable=False, mode=mode, dir_fd=run)


# -- the readers' side ---------------------------------------------------------------


def has_result(run: int) -> bool:
    try:
        os.stat(RESULT_FILE, dir_fd=run, follow_symlinks=False)
    except OSError:
        return False
    return True


ERROR_FIELDS = {"type": 200, "message": 10_000, "traceback": MAX_ERROR_BYTES}  # and the characters each keeps


def read_error(run: int) -> dict[str, Any] | None:
    """The error the child recorded (its type, message and traceback, as text of bounded
    length); None if it recorded none. The job wrote it, so anything else is dropped, and
    what is not text says so: whatever it holds, it reaches the job's record as text."""
    try:
        error = document.read(ERROR_FILE, MAX_ERROR_BYTES, ERROR_FILE, run)
    except FileNotFoundError:
        return None
    except InvalidJob as exc:
        return {"type": "unreadable", "message": str(exc)}
    if not isinstance(error, dict):
        return {"type": "unreadable", "message": f"error.json holds {type(error).__name__}, not an object"}
    return {key: _text(error[key], most) for key, most in ERROR_FIELDS.items() if key in error}


def _text(value: object, most: int) -> str:
    return value[:most] if isinstance(value, str) else f"unreadable: {type(value).__name__}, not text"


def tail(run: int, name: str, size: int) -> str:
    """The last `size` bytes of an output file ("" if there is none, or it is no regular file)."""
    try:
        fd = os.open(name, _READ, dir_fd=run)
    except OSError:
        return ""
    try:
        length = os.fstat(fd).st_size
        return os.pread(fd, size, max(0, length - size)).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def write_progress(run: int, data: bytes) -> None:
    """Replace the run's progress record, with the mode its output files have (the queue's)."""
    mode = os.stat(OUTPUT_FILES[0], dir_fd=run, follow_symlinks=False).st_mode & 0o666
    files.replace_file(PROGRESS_FILE, data, durable=False, mode=mode, dir_fd=run)


def read_progress(run: int) -> dict[str, Any] | None:
    """The run's last progress record, as `jobs.current().progress` writes it; None if it
    wrote none, `{"unreadable": why}` if what stands there is not one (the job wrote it)."""
    try:
        found = document.read(PROGRESS_FILE, MAX_PROGRESS_BYTES, PROGRESS_FILE, run)
        return checked_progress(found)
    except FileNotFoundError:
        return None
    except InvalidJob as exc:
        return {"unreadable": str(exc)}


def checked_progress(found: Any) -> dict[str, Any]:
    """A progress record's fields, each what `Current.progress` writes; InvalidJob naming the first that is not."""
    if not isinstance(found, dict):
        raise InvalidJob(f"progress.json holds {type(found).__name__}, not an object")
    done, total, message, at = (found.get(key) for key in ("done", "total", "message", "at"))
    if not _number(done) or done < 0:
        raise InvalidJob(f'progress.json field "done" must be a number, 0 or more, got {done!r:.40}')
    if total is not None and (not _number(total) or total <= 0):
        raise InvalidJob(f'progress.json field "total" must be a number above 0 or null, got {total!r:.40}')
    if not isinstance(message, str | None):
        raise InvalidJob(f'progress.json field "message" must be text, got {type(message).__name__}')
    if at is not None and (not _number(at) or not 0 <= at <= LATEST_MOMENT):
        raise InvalidJob(f'progress.json field "at" must be epoch seconds, got {at!r:.40}')
    return {"done": done, "total": total, "message": (message or "")[:MAX_MESSAGE], "at": at}


def _number(value: object) -> TypeGuard[float]:
    """A JSON number a float can hold (an int of 400 digits is JSON, and overflows a division)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and abs(value) <= _LARGEST


_LARGEST = 1e300


PID_MAX = 1 << 22  # the kernel's largest pid_max


class ChildPid(NamedTuple):
    """A run's child, as its `pid` file says."""

    pid: int
    written: float  # when it wrote the file (epoch seconds): about when the run started


def read_pid(run: int) -> ChildPid | None:
    """The child's pid and when it wrote it; None if not written yet, or not a pid file (a
    job run as its submitter owns its run's folder, so anything may stand there)."""
    try:
        data, status = files.read_regular(PID_FILE, 32, run)
        pid = int(data)
    except (OSError, ValueError):
        return None
    return ChildPid(pid, status.st_mtime) if 1 < pid <= PID_MAX else None
