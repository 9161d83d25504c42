"""The life of a job's child process, after the fork and before `os._exit`.

The child sets its title, sends its stdout and stderr to the attempt folder,
writes its pid there (for `forkvisor status`), runs the registered callable,
and writes the return value as JSON. A command job execs its program instead.
Its exit status is the protocol (see `forking`): 0 success, 100 cannot be
completed, anything else a failed attempt. An exception is recorded in the
attempt's `error.json` with its traceback, for the manager to put into the outcome.

Both kinds see FORKVISOR_QUEUE, FORKVISOR_JOB_ID, FORKVISOR_ATTEMPT,
FORKVISOR_ATTEMPT_DIR and FORKVISOR_FUNCTION in their environment (and so do
programs they start): `jobs.current()` reads them.
"""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import sys
import traceback
from typing import TextIO

from jobs import CannotComplete, Claim, Command, Registered, run_folder
from supervisor import containment
from supervisor.errors import CannotRun
from supervisor.forking import (
    EXIT_CANNOT_COMPLETE,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_ORPHANED,
    NO_CGROUPS,
    Cgroups,
    pass_gate,
)
from supervisor.privileges import Identity, become_in_child, hand_over
from supervisor.titles import Role, set_title

EXIT_COMMAND_NOT_FOUND, EXIT_CANNOT_EXEC = 127, 126  # as a shell reports a command it cannot run


def run_attempt(
    claim: Claim,
    registered: Registered,
    durable: bool,
    file_mode: int = 0o600,
    identity: Identity | None = None,
    cgroups: Cgroups = NO_CGROUPS,
    gate: int = -1,
) -> int:
    """Run one attempt of a Python job (as `identity`, if given; in its run's cgroup, if its
    `cgroup.procs` are given; once its `gate` opens, if given); return the exit status for
    `os._exit`."""
    run = _begin(claim, file_mode, identity, cgroups, gate)
    if run is None:
        return EXIT_ORPHANED
    spec = claim.spec
    try:
        value = registered.fn(*spec.args, **spec.kwargs)
    except CannotComplete as exc:
        return _failed(run, exc, EXIT_CANNOT_COMPLETE, file_mode)
    except SystemExit as exc:
        if exc.code in (None, 0):
            return EXIT_OK
        code = exc.code if isinstance(exc.code, int) and 1 <= exc.code <= 255 else EXIT_FAILED
        return _failed(run, exc, code, file_mode)  # an exit status is 8 bits: 256 would read as success
    except BaseException as exc:
        return _failed(run, exc, EXIT_FAILED, file_mode)
    finally:
        _flush()
    return _write_result(run, value, durable, file_mode)


def run_command(
    claim: Claim,
    command: Command,
    file_mode: int = 0o600,
    identity: Identity | None = None,
    cgroups: Cgroups = NO_CGROUPS,
    gate: int = -1,
) -> int:
    """Exec a command job's program in this child (as `identity`, if given, in a clean
    environment; in its run's cgroup, if given; once its `gate` opens, if given); return an
    exit status only if exec failed."""
    run = _begin(claim, file_mode, identity, cgroups, gate)
    if run is None:
        return EXIT_ORPHANED
    try:
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.close(stdin)
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_DFL)  # Python ignores these; the program must not inherit that
        if command.cwd is not None:
            _enter(command.cwd)
        os.execvpe(command.argv[0], command.argv, {**os.environ, **command.env})  # (a submitter's: clean already)
    except CannotRun as exc:
        return _failed(run, exc, EXIT_CANNOT_EXEC, file_mode)
    except OSError as exc:
        error = CannotRun(f"cannot run {command.argv[0]!r}: {exc.strerror}")
        code = EXIT_COMMAND_NOT_FOUND if exc.errno == errno.ENOENT else EXIT_CANNOT_EXEC
        return _failed(run, error, code, file_mode)
    finally:
        _flush()
    return EXIT_CANNOT_EXEC  # not reached: exec returns only by raising


def _enter(folder: str) -> None:
    try:
        os.chdir(folder)
    except OSError as exc:
        raise CannotRun(f"cannot enter the job's folder {folder}: {exc.strerror} (set with submit --cwd)") from None


def _begin(claim: Claim, file_mode: int, identity: Identity | None, cgroups: Cgroups, gate: int) -> int | None:
    """What every job's child does first: into its run's cgroup (given one: every process the
    job starts stays in it), title, output, pid, the user it runs as (given an `identity`, the
    run's folder and output become theirs, then the child becomes them), environment. (Its
    own random stream it already has: `random` reseeds itself in every forked child.) Return
    the descriptor of the run's folder, through which every file of the run is written; None
    if the folder is gone (a sweeper took the claim back before we started) or the gate was
    shut. Nothing is written into the run's folder before the gate opens: a run that leaves
    a trace there (its output, its pid) was counted on disk first."""
    containment.enter(cgroups)  # as root still, when it runs as its submitter: the cgroups are the manager's
    set_title(
        Role.JOB,
        f"forkvisor: job {claim.job_id} {claim.spec.function} attempt {claim.attempt}/{claim.policy.max_attempts}",
    )
    if gate >= 0 and not pass_gate(gate):
        return None
    # Plain strings and descriptors, not objects, from here: every object a child makes costs
    # it copy-on-write faults, which are most of a short job's overhead (docs/PERFORMANCE.md).
    try:
        run = run_folder.open_run(claim.place, claim.run)
        _redirect_output(run, file_mode)
    except FileNotFoundError:
        return None
    try:
        run_folder.write_pid(run, file_mode)
    except OSError:
        pass  # only `forkvisor status` reads it; the job runs anyway
    environ = os.environ
    if identity is not None:
        hand_over(run, (*run_folder.OUTPUT_FILES, run_folder.PID_FILE), identity)
        become_in_child(identity)  # before any of the job's code runs
        environ.clear()  # the manager's environment is not the submitter's to read
        environ.update(identity.start)
    for name, value in job_environment(claim).items():  # (update() goes through Mapping's generic code)
        environ[name] = value
    return run


def job_environment(claim: Claim) -> dict[str, str]:
    """What every job's process finds in its environment about its run."""
    job = claim.place.path  # QUEUE/claimed/OWNER/ID, as a string: no Path built in the child
    attempt = f"{job}/attempt-{claim.run}"
    return {
        "FORKVISOR_QUEUE": job.rsplit("/", 3)[0],
        "FORKVISOR_JOB_ID": claim.job_id,
        "FORKVISOR_ATTEMPT": str(claim.attempt),
        "FORKVISOR_ATTEMPT_DIR": attempt,
        "FORKVISOR_FUNCTION": claim.spec.function,
    }


def _redirect_output(run: int, file_mode: int) -> None:
    for fd, name in enumerate(run_folder.OUTPUT_FILES, start=1):
        target = run_folder.open_output(run, name, file_mode)
        if target != fd:  # the manager ran with fd 1 or 2 closed: open() took that very number
            os.dup2(target, fd)
            os.close(target)
    sys.stdout = _line_buffered(sys.stdout, 1)
    sys.stderr = _line_buffered(sys.stderr, 2)


def _line_buffered(stream: TextIO, fd: int) -> TextIO:
    """A text stream on `fd` that writes each line at once (for `forkvisor logs --follow`).
    The host program may have replaced sys.stdout/err (pytest, Jupyter, a log file): then
    open a new one, so print() and tracebacks land in the attempt's files."""
    try:
        if isinstance(stream, io.TextIOWrapper) and stream.fileno() == fd:
            stream.reconfigure(line_buffering=True)
            return stream  # the usual case, and cheaper than a new wrapper
    except (OSError, ValueError):  # no descriptor behind it, or closed
        pass
    return open(fd, "w", buffering=1, closefd=False)  # lives until os._exit


def _write_result(run: int, value: object, durable: bool, file_mode: int) -> int:
    try:
        data = json.dumps(value, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        message = f"the return value cannot be encoded as JSON ({exc}); return plain data (dict, list, str, number)"
        return _failed(run, TypeError(message), EXIT_FAILED, file_mode)
    try:
        run_folder.write_result(run, data + b"\n", durable, file_mode)
    except OSError as exc:  # disk full, say: a truncated result must never complete the job
        error = OSError(exc.errno, f"cannot write result.json: {exc.strerror}")
        return _failed(run, error, EXIT_FAILED, file_mode)
    return EXIT_OK


def _failed(run: int, exc: BaseException, code: int, file_mode: int) -> int:
    """Record the exception for the manager, print its traceback to stderr, return `code`.
    Neither may fail the protocol: on a full disk the exit status alone still tells."""
    trace = "".join(traceback.format_exception(exc))
    try:
        sys.stderr.write(trace)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr is full or closed
    error = {"type": type(exc).__name__, "message": str(exc), "traceback": trace}
    try:
        data = json.dumps(error, indent=1, default=repr).encode()
        run_folder.write_error(run, data, file_mode)
    except OSError:
        pass
    return code


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # the job closed or broke its own stream
