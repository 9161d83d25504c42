"""Forking, spawning, reaping and killing: the only module that calls `os.fork`, clone3
and vfork (`supervisor._vfork`), `os.posix_spawn`, `os._exit`, `os.wait4` and `os.killpg`.

A child never returns into the manager's code: its body runs inside
`try/finally: os._exit(code)`. Signals are blocked around `fork` so that no
handler runs half way, and the child restores default handlers before it
unblocks them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

import psutil

from supervisor import signals

Cgroups = tuple[int, int]  # the `cgroup.procs` a child writes itself into: its run's, its memory's (-1: none)
NO_CGROUPS: Cgroups = (-1, -1)
BirthCgroup = tuple[int, int]  # where a child starts: its run's cgroup v2 folder (or -1) and `cgroup.procs`

try:
    from supervisor import _vfork

    CAN_VFORK = True
except ImportError:  # installed without a C compiler: command jobs are spawned another way (`spawner`)
    CAN_VFORK = False

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CHILD_ERROR = 70  # forkvisor itself failed inside the child (EX_SOFTWARE)
EXIT_ORPHANED = 71  # the manager died, or its claim was taken back, before the child got going
EXIT_CANNOT_COMPLETE = 100  # the job said it can never succeed: no retry

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class ExitStatus:
    """How a child ended, decoded once from its wait status."""

    pid: int
    code: int | None
    signal: signal.Signals | None
    rusage: resource.struct_rusage

    @classmethod
    def decode(cls, pid: int, status: int, rusage: resource.struct_rusage) -> ExitStatus:
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            return cls(pid, None, signal.Signals(-code), rusage)
        return cls(pid, code, None, rusage)

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by {self.signal.name}"
        return f"exited {self.code}"


class Gate:
    """What a forked child waits at before any of its job's code runs: a pipe, its read end
    the child's, its write end the manager's. The manager opens it (`open`) once the run's
    count is on disk, or shuts it (`shut`: the child exits without running anything). If the
    manager dies first, the child dies with it (its parent-death signal)."""

    GO = b"1"

    def __init__(self) -> None:
        self.child_end, self.manager_end = os.pipe2(os.O_CLOEXEC)

    def forked(self) -> None:
        """The child has its read end: ours goes."""
        _close_quietly(self.child_end)

    def open(self) -> None:
        try:
            os.write(self.manager_end, self.GO)
        except BrokenPipeError:
            pass  # the child is gone already (killed from outside): its end is harvested as any other
        finally:
            self.shut()

    def shut(self) -> None:
        _close_quietly(self.manager_end)


def pass_gate(fd: int) -> bool:
    """In the child: wait at the gate; True if it opened, False if it was shut."""
    try:
        return os.read(fd, 1) == Gate.GO
    finally:
        _close_quietly(fd)


def start_child(
    body: Callable[[], int], close_fds: Iterable[int] = (), gate: Gate | None = None, cgroup: BirthCgroup | None = None
) -> int:
    """Fork a child that runs `body` and exits with its return value; return its pid. With a
    `gate`, `body` waits at it (`pass_gate`), and the parent's read end is closed here. With a
    `cgroup` (its folder and its `cgroup.procs`, open), the child is in it before `body` runs:
    born there where the host allows (`_fork`), else it moves itself in."""
    _flush_output()  # or the child would write the parent's buffered output again
    parent = os.getpid()
    fds = (*close_fds, *([] if gate is None else [gate.manager_end]), *(cgroup or ()))  # (the cgroup's: once in)
    with signals.blocked() as mask:
        pid, move_into = _fork(cgroup)
        if pid == 0:
            _run_child(body, parent, fds, mask, move_into)
    if gate is not None:
        gate.forked()
    # The new child waits in this CPU's run queue while the manager goes on, or for another
    # CPU to wake up: giving it this CPU now starts the job up to a millisecond sooner with an
    # idle manager (docs/PERFORMANCE.md, "Latency"), at no cost to throughput.
    os.sched_yield()
    try:
        os.setpgid(pid, pid)  # also done in the child: whichever runs first wins the race
    except (ProcessLookupError, PermissionError):
        pass  # the child already exited, or already called exec/setsid
    return pid


# Signals a spawned program starts with at their default: Python ignores SIGPIPE and
# SIGXFSZ, and an ignored signal stays ignored across exec; the handled ones for clarity.
# (glibc's posix_spawn leaves its two internal signals, 32 and 33, ignored: no program
# linked with glibc can use them, and its sigaddset refuses them, so they cannot be listed.)
SPAWN_DEFAULTS = (
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGCHLD,
)


def spawn(path: str, argv: list[str], env: dict[str, str], stdio: tuple[int, int, int]) -> int:
    """Start `path` in a new process group without forking this process (`posix_spawn`: no
    page of the manager is copied or made copy-on-write), with `stdio` as its descriptors
    0, 1 and 2, no signal blocked and the signals above at their default; return its pid.
    Every other descriptor of the manager is close-on-exec. OSError if it cannot start."""
    actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(stdio)]
    return os.posix_spawn(path, argv, env, file_actions=actions, setpgroup=0, setsigmask=(), setsigdef=SPAWN_DEFAULTS)


def vfork_exec(
    program: tuple[str, ...],
    env: Mapping[str, str],
    stdio: tuple[int, int, int],
    cwd: str | None,
    cgroups: Cgroups = NO_CGROUPS,
) -> int:
    """Start `program` (looked up in the PATH of its environment: the manager's with `env`
    over it) as a forked child would be set up (its own process group, death with the
    manager, `stdio` as 0, 1 and 2, in `cwd`, the signals at their default, in its run's
    cgroups if `cgroups`, their `cgroup.procs`, are given) without copying the manager:
    `supervisor/_vfork.c`. Return its pid. If it could not start, it has exited (70, 71,
    126 or 127 as a forked child would) and why is written to its stderr. OSError if the
    host cannot create a process. Needs `CAN_VFORK`."""
    environment = _manager_environment() | {os.fsencode(key): os.fsencode(value) for key, value in env.items()}
    name = program[0]
    pid, stage, error = _vfork.spawn(
        _candidates(name, environment.get(b"PATH")),
        [os.fsencode(word) for word in program],
        [key + b"=" + value for key, value in environment.items()],
        *stdio,
        None if cwd is None else os.fsencode(cwd),
        os.getpid(),
        *cgroups,
    )
    if stage not in (_vfork.STAGE_RUNS, _vfork.STAGE_ORPHANED):  # (orphaned: its manager is gone)
        _say_why(stage, error, name, cwd, stdio[2])
    return pid


PROGRAMS_KEPT = 256  # programs whose candidate files are kept (a queue of many programs: the first ones)


class _Encoded:  # (a namespace: the module's one cache)
    """The manager's environment, encoded for an exec: made again only when `os.environ`
    changed. Merging and encoding it for every command job cost about 35 µs; comparing
    CPython's dict of bytes behind `os.environ` with the copy costs about one."""

    seen: ClassVar[dict[bytes, bytes] | None] = None
    paths: ClassVar[dict[tuple[bytes | None, str], list[bytes]]] = {}


def _manager_environment() -> dict[bytes, bytes]:
    current = getattr(os.environ, "_data", None)  # (another Python: os.environb, read whole each time)
    seen = _Encoded.seen
    if seen is None or current is None or current != seen:
        seen = _Encoded.seen = dict(os.environb if current is None else current)
        _Encoded.paths.clear()
    return seen


def _candidates(name: str, path: bytes | None) -> list[bytes]:
    """The files `name` may be, in order: itself if it names a folder, else it in each of `path`'s folders."""
    found = _Encoded.paths.get((path, name))
    if found is None:
        if len(_Encoded.paths) >= PROGRAMS_KEPT:
            _Encoded.paths.clear()
        folders = os.get_exec_path({"PATH": os.fsdecode(path)} if path is not None else {})
        words = [name] if os.path.dirname(name) else [os.path.join(folder, name) for folder in folders]
        found = _Encoded.paths[(path, name)] = [os.fsencode(word) for word in words]
    return found


def _say_why(stage: int, error: int, name: str, cwd: str | None, stderr: int) -> None:
    """Write into a vforked job's stderr why its program did not start."""
    what = {
        _vfork.STAGE_SETUP: "cannot set up the job's process",
        _vfork.STAGE_CWD: f"cannot enter the job's folder {cwd}",
    }.get(stage, f"cannot run {name!r}")
    try:
        os.write(stderr, f"forkvisor-job: {what}: {os.strerror(error)}\n".encode())
    except OSError:
        pass  # a full disk: the exit status (70, 126, 127) still tells


# Whether this host may start a child in a cgroup (clone3's CLONE_INTO_CGROUP, Linux 5.7):
# False once it said it cannot, and for good.
_forks_into = CAN_VFORK and hasattr(_vfork, "fork_into")  # (a C module built before it had it: no)
_NOT_HERE = (errno.ENOSYS, errno.EINVAL, errno.E2BIG, errno.EPERM, errno.EACCES)


def _fork(cgroup: BirthCgroup | None) -> tuple[int, int]:
    """Fork, the child in `cgroup` where the host allows it: (pid, and in the child the
    `cgroup.procs` it must still write itself into, or -1). A child forked into its cgroup
    waits for no cgroup migration: one waits an RCU grace period where cgroup2 is not
    mounted with `favordynmods` (milliseconds before the job's code may run)."""
    global _forks_into
    if cgroup is None:
        return os.fork(), -1
    folder, procs = cgroup
    if _forks_into and folder >= 0:
        try:
            return _vfork.fork_into(folder), -1
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.ENOMEM):
                raise  # the host cannot make a process now: as os.fork would say
            if exc.errno in _NOT_HERE:
                _forks_into = False
            # ENOTSUP: this process has other threads now (or another C library): os.fork
    return os.fork(), procs


def forks_into(path: str) -> bool:
    """Whether a child forked into the (new, empty) cgroup at `path` lives here: clone3 can do
    it, and the kernel does not kill it at birth. (Linux 6.18 SIGKILLs a child born in a
    cgroup whose `cgroup.kill` count differs from its parent's cgroup's: one that was ever
    killed, or any where the manager's own cgroup was. The manager then moves each child
    in, as without clone3.) One short child, at a manager's start; False also if this
    process has other threads then (it cannot tell)."""
    global _forks_into
    if not _forks_into:
        return False
    folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with signals.blocked():
            pid = _vfork.fork_into(folder)
            if pid == 0:
                os._exit(0)
    except OSError as exc:
        if exc.errno in _NOT_HERE:
            _forks_into = False
        return False
    finally:
        os.close(folder)
    _, status = os.waitpid(pid, 0)
    _forks_into = status == 0
    return _forks_into


def _run_child(body: Callable[[], int], parent: int, fds: tuple[int, ...], mask: set[int], move_into: int) -> None:
    code = EXIT_CHILD_ERROR
    try:
        if move_into >= 0:  # into the run's cgroup before anything of the job runs
            os.write(move_into, b"0")
        os.setpgrp()
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the manager died before PDEATHSIG was armed
            code = EXIT_ORPHANED
            return
        for fd in fds:
            _close_quietly(fd)
        signals.reset_in_child(mask)
        code = body()
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None: the manager was started with that descriptor closed
                stream.flush()
        except (OSError, ValueError):
            pass  # a closed stream or a gone reader must not stop every fork


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass  # already closed


def reap_nowait() -> Iterator[ExitStatus]:
    """Every child that has exited, without blocking."""
    while True:
        try:
            pid, status, rusage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no children at all
        if pid == 0:
            return
        yield ExitStatus.decode(pid, status, rusage)


def wait_for(pid: int, timeout: float) -> ExitStatus | None:
    """Reap one child, SIGKILLing it if it has not exited within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            found, status, rusage = os.wait4(pid, os.WNOHANG)
        except ChildProcessError:
            return None  # already reaped
        if found:
            return ExitStatus.decode(found, status, rusage)
        if time.monotonic() >= deadline:
            _kill_quietly(pid, signal.SIGKILL)
            deadline = float("inf")
            found, status, rusage = os.wait4(pid, 0)
            return ExitStatus.decode(found, status, rusage)
        time.sleep(delay)  # a bounded wait for a child we have signalled, not a poll for work
        delay = min(delay * 2, 0.05)


def job_tree(pid: int) -> list[psutil.Process]:
    """The child's descendants, found now (they may leave its process group later)."""
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def kill_group(pgid: int) -> None:
    """SIGKILL what is left in a reaped child's process group. Safe right after the reap:
    Linux reuses no pid while a process group of that id still has members."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the usual case: the group died with the child


def signal_tree(pid: int, signum: signal.Signals, descendants: Iterable[psutil.Process] = ()) -> None:
    """Send `signum` to a child's process group and to descendants that left it."""
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        _kill_quietly(pid, signum)  # no group (yet): the child itself
    except PermissionError:
        _kill_quietly(pid, signum)
    for process in descendants:
        try:
            process.send_signal(signum)
        except psutil.Error:
            pass  # already gone, or the pid is no longer the process we saw


def _kill_quietly(pid: int, signum: signal.Signals) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # already gone


def become_subreaper(adopt: bool = True) -> None:
    """Adopt orphaned grandchildren so they are reaped here, not left as zombies elsewhere
    (`adopt=False`: stop adopting them)."""
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, int(adopt), 0, 0, 0)
