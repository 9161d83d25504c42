"""Every process a job starts belongs to its run: the manager finds, signals, freezes and
kills them all, including those that left the job's process group (`setsid`, a double
fork), and no run outlives its end or overlaps its retry on this host.

Two ways, chosen when a manager starts (`detect`), said in its log and by `status`:

- **cgroup**: where this process may make cgroups below its own (cgroup v2: a service
  with systemd's `Delegate=yes`, a container or an allocation that gives a writable
  subtree, or root), each run gets one, `<own cgroup>/forkvisor/<owner>/<job>.<run>`.
  The job's child is born in it (`forking.start_child`: clone3, where the host allows
  it) or enters it before any of the job's code runs, and every process it starts stays
  in it (leaving needs write access to a cgroup above, which a job run as
  its submitter has not). The manager kills a run with `cgroup.kill` (the kernel, all at
  once, pids never involved), sends other signals to the members `cgroup.procs` lists
  (each through a pidfd checked to be still in the run), freezes it with `cgroup.freeze`,
  and removes it once empty. The owner file says where its runs are: whoever reaps a dead
  owner on this host kills what is left there and waits for it to be gone before a job
  goes back.
- **processes**: elsewhere. The manager is a child subreaper (what a job leaves when its
  parent exits comes to it), and every process of a run bears its run's mark, in two
  ways: a descriptor every process of the run inherits (a memfd named for the run, which
  survives fork, exec and `setsid`: `mark_run`), and its run in the environment of what it
  execs (`FORKVISOR_ATTEMPT_DIR`). Both name the owner's folder (`/claimed/OWNER/JOB/
  attempt-N`: owner names are unique). The orphans it adopts, and a dead owner's
  leftovers found in /proc by that mark, are killed, each through a pidfd opened and
  checked before the signal, never by a bare pid. A process that both closes its
  descriptors and drops its environment without exec can escape this mode (a daemon
  that closes every descriptor and clears its environment): docs/ARCHITECTURE.md says
  what each mode guarantees.

What this module does not do: decide when (that is `children`, `outcomes`, the sweeper).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs import host_part, is_owner_name
from supervisor import cgroupfs, forking, run_memory
from supervisor.cgroupfs import FOLDER
from supervisor.errors import Unavailable

log = logging.getLogger(__name__)
MODES = ("auto", "cgroup", "processes")
RUN_MARK = "FORKVISOR_ATTEMPT_DIR"  # in the environment of every process a run execs (`child.job_environment`)
FD_MARK = "forkvisor-run:"  # the name of the memfd every process of a run holds (`mark_run`)
_MEMFD = "/memfd:"  # how /proc shows a memfd's name (then " (deleted)")
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
LEFTOVERS_TIMEOUT = 10.0  # how long the end of a dead owner's leftovers is waited for


# -- finding where runs may go ---------------------------------------------------------------


def _moves_note() -> str:
    """A word on what a move between cgroups may cost here (a job's start waits for it)."""
    try:
        with open("/proc/self/mountinfo", "rb") as mounts:
            if cgroupfs.favors_moves(mounts.read()):
                return ""
    except OSError:
        return ""
    return "; cgroup2 without favordynmods: a run's move into a cgroup may wait milliseconds (docs/DEPLOYING.md)"


def cgroup2_mount() -> str | None:
    """Where the cgroup v2 hierarchy is mounted (the unified one, on a hybrid host), or None."""
    return cgroupfs.mount(b"cgroup2")


def detect(preference: str = "auto") -> Containment:
    """How this manager contains its runs: cgroups where it may make them below its own,
    processes otherwise (or as `preference` says; Unavailable if cgroups were asked for and
    cannot be had)."""
    if preference == "processes":
        return ProcessContainment("asked for (--containment processes)")
    own, base, why_not = _writable_base()
    if base is not None:
        memory, why_no_memory = run_memory.detect(own, base)
        return CgroupContainment(base, memory, why_no_memory)
    if preference == "cgroup":
        raise Unavailable(f"--containment cgroup: {why_not}")
    return ProcessContainment(why_not)


def _writable_base() -> tuple[str, str | None, str]:
    """This process's v2 cgroup, the folder of runs below it if this process may make
    cgroups there (else None), and why not."""
    mount = cgroup2_mount()
    if mount is None:
        return "", None, "no cgroup v2 hierarchy is mounted"
    own = cgroupfs.own(mount)
    if own is None or not os.path.isdir(own):
        return "", None, "this process has no cgroup v2 of its own"
    base, refused = cgroupfs.divisible(own)
    if base is None:
        return own, None, f"its cgroup {own} is not delegated to it ({refused}: see docs/DEPLOYING.md)"
    return own, base, ""


# -- the two ways ------------------------------------------------------------------------------


class Containment:
    """How a manager contains its runs (see the module docstring)."""

    mode = ""

    def describe(self) -> str:
        raise NotImplementedError

    def runs_folder(self, owner: str) -> str | None:
        """Where an owner's runs are, for its owner file (None: they are not in cgroups)."""
        return None

    def open_owner(self, owner: str) -> None:
        """Make the place of an owner's runs (at registration)."""

    def close_owner(self, owner: str) -> None:
        """Remove the place of an owner's runs, if empty (when it stops)."""

    def clear_dead_owners(self) -> None:
        """End what the runs of this host's dead managers left, wait for it to be gone, and
        remove their places: at a manager's start, before it claims anything. Their reaper
        does the same before it gives their jobs back, but a sweeper of another host cannot
        (it sees no process of this one): without this, a manager restarted here could
        run a job's retry beside what its earlier run left."""
        for owner in sorted(_marked_owners()):
            if _dead_here(owner) and not _end_marked(owner, LEFTOVERS_TIMEOUT):
                log.warning("what dead manager %s left on this host is not all gone", owner)

    def new_run(self, owner: str, job_id: str, run: int, memory_limit: int | None = None) -> CgroupRun | None:
        """A cgroup for a run about to start (None: not in cgroups), with its memory limited
        to `memory_limit` bytes where a memory controller is ours."""
        return None

    def mark_run(self, mark: str) -> int:
        """A descriptor for the run's first process to inherit, which marks every process of
        the run (-1: none, its cgroup holds them); the caller closes it once that started."""
        return -1


class ProcessContainment(Containment):
    mode = "processes"

    def __init__(self, why: str) -> None:
        self.why = why

    def describe(self) -> str:
        return f"processes (a run's processes are found by their parent and their mark; no cgroup: {self.why})"

    def mark_run(self, mark: str) -> int:
        """A memfd named for the run: every process of the run inherits it, through fork, exec
        and `setsid`, and /proc shows its name to whoever may look. Not close-on-exec, so
        that an exec'd program keeps it: the manager starts no other process while it holds
        it (it is single-threaded, and closes it once the run's first process started)."""
        return os.memfd_create(FD_MARK + mark, 0)


class CgroupContainment(Containment):
    mode = "cgroup"

    def __init__(self, base: str, memory: run_memory.Memory | None = None, why_no_memory: str = "") -> None:
        self.base = base
        self.memory = memory
        self.why_no_memory = why_no_memory
        self.forks_into: bool | None = None  # whether a run's first process is born in its cgroup (`open_owner`)

    def describe(self) -> str:
        if self.memory is not None:
            limits = f"memory limits by the kernel, below {self.memory.base}"
        else:
            limits = f"memory limits by watching the RSS: {self.why_no_memory}"
        born = "its first process born in it" if self.forks_into else "its first process moved in"
        return f"cgroup (each run in its own, below {self.base}, {born}; {limits}{self._moves_note()})"

    def _moves_note(self) -> str:
        """A word on the moves a run's start may wait for (none where its first process is
        born in its cgroup, unless it still enters a v1 memory cgroup)."""
        v1_memory = self.memory is not None and not self.memory.files.own_cgroup
        return _moves_note() if v1_memory or not self.forks_into else ""

    def runs_folder(self, owner: str) -> str | None:
        return os.path.join(self.base, owner)

    def open_owner(self, owner: str) -> None:
        try:
            os.mkdir(os.path.join(self.base, owner))
        except FileExistsError:
            pass
        if self.memory is not None:
            self.memory.open_owner(owner)
        if self.forks_into is None:
            self.forks_into = _probe_fork_into(os.path.join(self.base, owner, "probe"))

    def close_owner(self, owner: str) -> None:
        try:
            os.rmdir(os.path.join(self.base, owner))
        except OSError:
            pass  # runs still being emptied: the next reaper of this owner removes it
        if self.memory is not None:
            self.memory.close_owner(owner)

    def clear_dead_owners(self) -> None:
        """Also kill the cgroups of this host's dead owners (their runs', all at once), wait
        for them to empty, and remove them; an owner whose pid lives (its manager, or a
        process that took its pid) is left to its reaper, who knows its start time."""
        super().clear_dead_owners()  # a dead manager that ran without cgroups
        try:
            owners = [name for name in os.listdir(self.base) if _dead_here(name)]
        except OSError:
            return
        for name in owners:
            if not _end_cgroups(os.path.join(self.base, name), LEFTOVERS_TIMEOUT):
                log.warning("what dead manager %s left on this host is not all gone", name)
        if self.memory is not None:
            self.memory.prune(_dead_here)

    def new_run(self, owner: str, job_id: str, run: int, memory_limit: int | None = None) -> CgroupRun | None:
        path = os.path.join(self.base, owner, f"{job_id}.{run}")
        made = True
        try:
            os.mkdir(path)
        except FileExistsError:
            made = False  # left by a run of the same number (a claim that went back): emptied below
        except OSError as exc:
            log.warning("cannot make the cgroup of run %s of job %s: %s; it runs without one", run, job_id, exc)
            return None
        found = CgroupRun(path)
        try:
            if not made:
                found.kill()  # what the earlier claim of this run left (its child is then moved in: `forks_into`)
            if self.memory is not None:
                found.memory = self.memory.new_run(owner, job_id, run, memory_limit)
            return found.opened(born_inside=made and bool(self.forks_into))
        except OSError as exc:  # gone meanwhile: a sweeper ended this owner's runs while it stood still
            log.warning("cannot use the cgroup of run %s of job %s: %s; it runs without one", run, job_id, exc)
            found.started()  # (its descriptors opened so far)
            with contextlib.suppress(OSError):
                found.remove()
            return None


@dataclass
class CgroupRun:
    """One run's cgroup: its folder, and (until the child entered it) its `cgroup.procs`
    opened for the child to write itself into."""

    path: str
    procs: int = -1
    memory: run_memory.RunMemory | None = None  # its memory cgroup, where a memory controller is ours
    seen: set[int] = field(default_factory=set)  # pids seen in it (`sample`)
    cgroup_fd: int = -1  # the cgroup's folder, open until the child started: a fork may start it there

    def opened(self, born_inside: bool = False) -> CgroupRun:
        """Open what the run's first process needs to enter it (`born_inside`: its folder too,
        to be forked into it; never one that was killed, see `forking.forks_into`)."""
        if born_inside:
            self.cgroup_fd = os.open(self.path, _O_DIR)
        self.procs = os.open(os.path.join(self.path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        return self

    def entries(self) -> tuple[int, int]:
        """The `cgroup.procs` the run's first process writes itself into (its cgroup's and its
        memory cgroup's, or -1), before any of the job's code."""
        return self.procs, -1 if self.memory is None else self.memory.procs

    def fork_into(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """For a forked first process: its cgroup (folder, or -1, and `cgroup.procs`:
        `forking.start_child` starts it there), and the `cgroup.procs` it still writes itself
        into (its memory cgroup's, or -1)."""
        return (self.cgroup_fd, self.procs), (-1, -1 if self.memory is None else self.memory.procs)

    def started(self) -> None:
        """In the manager, once the child started: it has its own copy of the descriptors."""
        for fd in (self.procs, self.cgroup_fd):
            if fd >= 0:
                os.close(fd)
        self.procs = self.cgroup_fd = -1
        if self.memory is not None:
            self.memory.started()

    def sample(self) -> None:
        """Note the processes in the run now (the manager looks twice a second and at its end)."""
        self.seen.update(self.pids())

    def cost(self) -> dict[str, Any]:
        """What the run's processes used, all of them, as the kernel counted: CPU seconds
        (user, system), and where its memory cgroup is, its peak and OOM kills; and how many
        processes were seen in it (a lower bound: one that lived between two looks is missed)."""
        usage = _keyed(os.path.join(self.path, "cpu.stat"))
        found: dict[str, Any] = {
            "cpu_user": usage.get("user_usec", 0) / 1e6,
            "cpu_system": usage.get("system_usec", 0) / 1e6,
            "peak_memory": None,
            "oom_kills": None,
            "processes_seen": len(self.seen),
            "from": "cgroup",
        }
        if self.memory is not None:
            found.update(peak_memory=self.memory.peak(), oom_kills=self.memory.oom_kills())
        return found

    def pids(self) -> list[int]:
        listed = cgroupfs.read(os.path.join(self.path, "cgroup.procs"), most=1 << 24) or b""
        return [int(line) for line in listed.split()]

    def signal(self, signum: signal.Signals) -> None:
        """Send `signum` to every process of the run: SIGKILL through `cgroup.kill`, the rest
        one by one, each through a pidfd checked to be still in this run (a pid read from
        `cgroup.procs` may exit, and be reused, before the signal)."""
        if signum == signal.SIGKILL:
            self.kill()
            return
        for pid in self.pids():
            _signal_member(pid, signum, self._relative)

    def kill(self) -> None:
        _write(os.path.join(self.path, "cgroup.kill"), "1")

    def freeze(self, frozen: bool) -> None:
        _write(os.path.join(self.path, "cgroup.freeze"), "1" if frozen else "0")

    def populated(self) -> bool:
        return _event(self.path, "populated") != "0"

    def remove(self) -> bool:
        """Remove the cgroup (and its memory cgroup) once empty; whether both are gone."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
                return False
            raise
        return self.memory is None or self.memory.remove()

    @property
    def _relative(self) -> str:
        """The run's cgroup as /proc/PID/cgroup names it (the path below the mount)."""
        mount = cgroup2_mount() or ""
        return "/" + os.path.relpath(self.path, mount)


def _probe_fork_into(path: str) -> bool:
    """Whether runs here may be born in their cgroup (`forking.forks_into`), tried in a new
    cgroup at `path`, removed after."""
    try:
        os.mkdir(path)  # (in the owner's new folder: never one killed before)
    except OSError:
        return False
    try:
        return forking.forks_into(path)
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(path)


def _signal_member(pid: int, signum: signal.Signals, cgroup: str) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return  # gone already
    try:
        if _cgroup_of(pid) == cgroup and not _exited(pidfd):
            signal.pidfd_send_signal(pidfd, signum)
    except ProcessLookupError:
        pass  # exited meanwhile
    finally:
        os.close(pidfd)


def _cgroup_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as groups:
            for line in groups:
                if line.startswith("0::"):
                    return line[3:].rstrip("\n")
    except OSError:
        pass
    return None


def _exited(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])


def enter(procs: tuple[int, ...]) -> None:
    """In the run's first process, before any of the job's code: write it into each cgroup
    whose `cgroup.procs` is given (-1: none; `CgroupRun.entries`), and close them."""
    for fd in procs:
        if fd >= 0:
            os.write(fd, b"0")
            os.close(fd)


def _keyed(path: str) -> dict[str, int]:
    """A cgroup file of `key value` lines (`cpu.stat`), its whole numbers by key."""
    pairs = (line.split(b" ", 1) for line in (cgroupfs.read(path) or b"").splitlines())
    return {key.decode(): int(value) for key, value in (pair for pair in pairs if len(pair) == 2) if value.isdigit()}


def _write(path: str, text: str) -> None:
    try:
        cgroupfs.write(path, text)
    except FileNotFoundError:
        pass  # removed: nothing left to act on
    except OSError as exc:
        if exc.errno != errno.ENODEV:  # (cgroup.kill on a kernel before 5.14)
            raise


def _event(path: str, key: str) -> str | None:
    for line in (cgroupfs.read(os.path.join(path, "cgroup.events")) or b"").splitlines():
        name, _, value = line.partition(b" ")
        if name == key.encode():
            return value.strip().decode()
    return None


# -- what a dead owner left on this host ---------------------------------------------------------


def end_leftovers(runs_folder: str | None, owner: str, timeout: float = 10.0) -> bool:
    """End every process a dead owner's runs left on this host, and wait until they are
    gone (at most `timeout` seconds); whether none is left. `runs_folder`: the owner's
    cgroups, as its owner file recorded them (checked: a cgroup v2 folder named for the
    owner); else its processes are found by their mark (`run_mark`), which names it."""
    if runs_folder is not None and _is_runs_folder(runs_folder, owner):
        return _end_cgroups(runs_folder, timeout)
    return _end_marked(owner, timeout)


def _dead_here(owner: str) -> bool:
    """Whether `owner` names a manager of this host whose process is gone (by its pid: one
    reused meanwhile makes it look alive, which leaves its leftovers to its reaper, never
    ends a live manager's runs)."""
    if not is_owner_name(owner):
        return False
    host, pid, _ = owner.rsplit(".", 2)
    return host == host_part(socket.gethostname()) and not os.path.exists(f"/proc/{pid}")


def _marked_owners() -> set[str]:
    """The owners named by the marks of this pid namespace's processes (a job may forge the
    mark of its environment: it can only have itself ended with that owner's runs)."""
    owners: set[str] = set()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid() and _in_our_namespace(int(name)):
            owners.update(mark.split("/")[2] for mark in _marks(int(name)) if mark.count("/") >= 3)
    return owners


def _in_our_namespace(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
    except OSError:
        return False


def _is_runs_folder(path: str, owner: str) -> bool:
    mount = cgroup2_mount()
    real = os.path.realpath(path)
    return (
        mount is not None
        and real.startswith(mount.rstrip("/") + "/")
        and Path(real).name == owner
        and Path(real).parent.name == FOLDER
    )


def _subfolders(folder: str) -> list[str]:
    """The cgroups below `folder` (its other entries are the kernel's files)."""
    try:
        with os.scandir(folder) as entries:
            return [entry.path for entry in entries if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _end_cgroups(folder: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    pending = [CgroupRun(path) for path in _subfolders(folder)]
    for run in pending:
        run.kill()
    while pending and time.monotonic() < deadline:
        pending = [run for run in pending if not run.remove()]
        if pending:
            time.sleep(0.01)  # the kernel is killing them: a bounded wait for a known end
    if pending:
        log.warning("the processes of %d run(s) in %s are not gone after %gs", len(pending), folder, timeout)
        return False
    try:
        os.rmdir(folder)
    except OSError:
        pass
    return True


def marked(owner: str) -> Iterator[tuple[int, int]]:
    """(pid, pidfd) of every process that bears the mark of one of `owner`'s runs (a pidfd
    opened before its marks were read again: the process, not a pid reused meanwhile)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == os.getpid() or not _of_owner(pid, owner):
            continue
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        if _of_owner(pid, owner) and not _exited(pidfd):
            yield pid, pidfd
        else:
            os.close(pidfd)


def _of_owner(pid: int, owner: str) -> bool:
    return any(mark.startswith(f"/claimed/{owner}/") for mark in _marks(pid))


def strays(exclude: set[int], unmarked: bool = False) -> Iterator[tuple[int, int, set[str]]]:
    """(pid, pidfd, the runs it bears the mark of) of each child of this process (a subreaper:
    orphans come to it) that is not in `exclude` and bears a run's mark (with `unmarked`,
    also each living one that bears none); the caller closes the pidfds."""
    for child in _children():
        if child in exclude:
            continue
        try:
            pidfd = os.pidfd_open(child)
        except OSError:
            continue
        ours = _parent(child) == os.getpid() and not _exited(pidfd)
        marks = _marks(child) if ours else set()
        if marks or (ours and unmarked):
            yield child, pidfd, marks
        else:
            os.close(pidfd)


def started(pid: int) -> int | None:
    """When a process started, in clock ticks since boot (/proc's `starttime`: one clock for
    every process, kept by a zombie too); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            return int(stat_file.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _children() -> list[int]:
    """This process's children (from /proc/PID/task/*/children, which the kernel keeps).
    (Files here are read as bytes: a manager that dropped its privileges may not be able
    to import a codec any more.)"""
    found: list[int] = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children", "rb") as children:
                found += [int(pid) for pid in children.read().split()]
    except OSError:
        pass
    return found


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat_file:
            return int(stat_file.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def run_mark(owner: str, job_id: str, run: int) -> str:
    """A run's mark: where its folder is below the queue (owner names are unique)."""
    return f"/claimed/{owner}/{job_id}/attempt-{run}"


def _marks(pid: int) -> set[str]:
    """The runs a process bears the mark of (`run_mark`): by a descriptor it holds, and by its
    environment (its run folder's path, whose tail is the mark); none for most processes."""
    found = {name[len(FD_MARK) :] for name in _memfd_names(pid) if name.startswith(FD_MARK)}
    prefix = f"{RUN_MARK}=".encode()
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            for entry in environ.read().split(b"\0"):
                if entry.startswith(prefix):
                    path = os.fsdecode(entry[len(prefix) :])
                    found.add(path[path.rfind("/claimed/") :])
    except OSError:
        pass
    return found


def _memfd_names(pid: int) -> Iterator[str]:
    """The names of the memfds a process holds (as /proc shows them: to its user and root)."""
    folder = f"/proc/{pid}/fd"
    try:
        descriptors = os.listdir(folder)
    except OSError:
        return
    for fd in descriptors:
        try:
            target = os.readlink(f"{folder}/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith(_MEMFD):
            yield target[len(_MEMFD) :].removesuffix(" (deleted)")


def _end_marked(owner: str, timeout: float) -> bool:
    found = list(marked(owner))
    for _, pidfd in found:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    try:
        for _, pidfd in found:
            left = max(0.0, deadline - time.monotonic())
            if not select.select([pidfd], [], [], left)[0]:
                log.warning("a process of a dead owner's run is not gone after %gs", timeout)
                return False
    finally:
        for _, pidfd in found:
            os.close(pidfd)
    return True
