"""A run's memory in the kernel's hands: where a memory controller is ours, each run has a
memory cgroup, whose limit is the run's `memory_limit` (the kernel's OOM killer enforces
it, on every process of the run at once: no sampling, no burst slips through), and which
says the run's peak and how many of its processes the OOM killer took. (v1's limit is on
RAM: on a host with swap, a run may swap past it, as `memory.max` lets it on v2.)

Two ways, the first that this host offers:

- **cgroup v2** (a pure v2 host that delegates `memory` to the manager's cgroup: systemd's
  `Delegate=yes`, a container): the run's own cgroup is its memory cgroup (`memory.max`,
  `memory.peak`, `memory.events`). cgroup v2 lends a controller only to the children of a
  cgroup without processes of its own, so the manager first moves into a leaf beside its
  runs (`cgroupfs.lend`), and enables `memory` at each level down to the runs.
- **cgroup v1's `memory` hierarchy**, where this process may make cgroups below its own
  there (a hybrid host, as root): `<own>/forkvisor/<owner>/<job>.<run>`, entered by the
  run's first process together with its v2 cgroup (`containment`).

Elsewhere the tree's RSS is watched (`limits.tree_rss`). docs/ARCHITECTURE.md says what
each host gets.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass

from supervisor import cgroupfs


@dataclass(frozen=True)
class Files:
    """A memory cgroup's files: its limit, its peak, and the one that counts OOM kills
    (an `oom_kill N` line in both versions)."""

    limit: str
    peak: str
    oom: str
    own_cgroup: bool  # the run's own (v2) cgroup: entered with it, made and removed with it


V1 = Files("memory.limit_in_bytes", "memory.max_usage_in_bytes", "memory.oom_control", own_cgroup=False)
V2 = Files("memory.max", "memory.peak", "memory.events", own_cgroup=True)


def detect(own_cgroup: str, base: str) -> tuple[Memory | None, str]:
    """The memory cgroups runs may have here, or None and why not: cgroup v2's, lent to the
    runs below `base` (`FOLDER` below `own_cgroup`, this process's v2 cgroup), else v1's."""
    why_not_v2 = cgroupfs.lend(own_cgroup, base, "memory")
    if not why_not_v2:
        return Memory(base, V2), ""
    found, why_not_v1 = _detect_v1()
    return found, "" if found is not None else f"{why_not_v2}; {why_not_v1}"


def _detect_v1() -> tuple[Memory | None, str]:
    mount = cgroupfs.mount(b"cgroup", controller=b"memory")
    if mount is None:
        return None, "no memory controller this process may use (cgroup v1's is not mounted)"
    own = cgroupfs.own(mount, controller=b"memory")
    if own is None or not os.path.isdir(own):
        return None, "this process has no memory cgroup of its own"
    base, refused = cgroupfs.divisible(own)
    if base is None:
        return None, f"its memory cgroup {own} is not its to divide ({refused})"
    return Memory(base, V1), ""


@dataclass(frozen=True)
class Memory:
    """Where the memory cgroups of this host's runs go."""

    base: str
    files: Files

    def open_owner(self, owner: str) -> None:
        folder = os.path.join(self.base, owner)
        try:
            os.mkdir(folder)
        except FileExistsError:
            pass
        if self.files.own_cgroup:
            try:
                cgroupfs.enable(folder, "memory")  # down to its runs
            except OSError:
                pass  # its runs then have no memory.max: `new_run` finds out, and they are watched by RSS

    def close_owner(self, owner: str) -> None:
        try:
            os.rmdir(os.path.join(self.base, owner))
        except OSError:
            pass  # a run's cgroup is still there: a later manager's prune removes it

    def prune(self, is_dead: Callable[[str], bool]) -> None:
        """Remove the memory cgroups of owners `is_dead` says are gone (the kernel refuses
        one that still has processes: those are ended through their v2 cgroup first)."""
        try:
            owners = [name for name in os.listdir(self.base) if is_dead(name)]
        except OSError:
            return
        for owner in owners:
            folder = os.path.join(self.base, owner)
            try:
                runs = [entry.path for entry in os.scandir(folder) if entry.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for run in runs:
                RunMemory(run, None, self.files).remove()
            self.close_owner(owner)

    def new_run(self, owner: str, job_id: str, run: int, limit: int | None) -> RunMemory | None:
        """The memory cgroup of a run about to start, limited to `limit` bytes (None: no
        limit); None if it cannot be made (the run is then watched by its RSS)."""
        path = os.path.join(self.base, owner, f"{job_id}.{run}")
        try:
            os.mkdir(path)
        except FileExistsError:
            pass  # the run's v2 cgroup, or left by a run of the same number (killed with its v2 cgroup)
        except OSError:
            return None
        found = RunMemory(path, limit, self.files)
        try:
            if limit:
                cgroupfs.write(os.path.join(path, self.files.limit), str(limit))
            if not self.files.own_cgroup:
                found.procs = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            found.remove()
            return None
        return found


@dataclass
class RunMemory:
    """One run's memory cgroup, and (until its first process entered) its `cgroup.procs`."""

    path: str
    limit: int | None
    files: Files = V1
    procs: int = -1  # (v2: -1, the run's first process enters it with its cgroup)

    def started(self) -> None:
        if self.procs >= 0:
            os.close(self.procs)
            self.procs = -1

    def peak(self) -> int | None:
        """The most memory the run's processes held at once (bytes), as the kernel counts."""
        text = cgroupfs.read(os.path.join(self.path, self.files.peak))
        return int(text) if text is not None and text.strip().isdigit() else None

    def oom_kills(self) -> int:
        """How many of the run's processes the OOM killer took at its limit."""
        text = cgroupfs.read(os.path.join(self.path, self.files.oom)) or b""
        for line in text.splitlines():
            name, _, value = line.partition(b" ")
            if name == b"oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def remove(self) -> bool:
        """Remove the cgroup once empty (its processes die with the run's v2 cgroup); whether it is gone."""
        self.started()
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                return False
            raise
        return True
