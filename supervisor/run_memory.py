"""A run's memory in the kernel's hands: where a memory controller is ours, each run has a
memory cgroup, whose limit is the run's `memory_limit` (the kernel's OOM killer enforces
it, on every process of the run at once: no sampling, no burst slips through), and which
says the run's peak and how many of its processes the OOM killer took. (v1's limit is on
RAM: on a host with swap, a run may swap past it, as `memory.max` lets it on v2.)

The controller used is cgroup v1's `memory` hierarchy, where this process may make
cgroups below its own there (a hybrid host, as root): `<own>/forkvisor/<owner>/<job>.<run>`,
entered by the run's first process together with its v2 cgroup (`containment`). On a pure
cgroup v2 host the memory controller lives in the run's own cgroup, but enabling it there
needs the manager to sit in a leaf of its delegated cgroup (the "no internal processes"
rule); that is not done yet: such hosts watch the tree's RSS, as hosts without cgroups do
(`limits.tree_rss`). docs/ARCHITECTURE.md says what each host gets.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass

from supervisor import cgroupfs

LIMIT, PEAK, OOM = "memory.limit_in_bytes", "memory.max_usage_in_bytes", "memory.oom_control"


def detect() -> tuple[Memory | None, str]:
    """The memory cgroups runs may have here, or None and why not."""
    mount = cgroupfs.mount(b"cgroup", controller=b"memory")
    if mount is None:
        return None, "no memory controller this process may use (cgroup v1's is not mounted)"
    own = cgroupfs.own(mount, controller=b"memory")
    if own is None or not os.path.isdir(own):
        return None, "this process has no memory cgroup of its own"
    base, refused = cgroupfs.divisible(own)
    if base is None:
        return None, f"its memory cgroup {own} is not its to divide ({refused})"
    return Memory(base), ""


@dataclass(frozen=True)
class Memory:
    """Where the memory cgroups of this host's runs go."""

    base: str

    def open_owner(self, owner: str) -> None:
        try:
            os.mkdir(os.path.join(self.base, owner))
        except FileExistsError:
            pass

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
                RunMemory(run, None).remove()
            self.close_owner(owner)

    def new_run(self, owner: str, job_id: str, run: int, limit: int | None) -> RunMemory | None:
        """The memory cgroup of a run about to start, limited to `limit` bytes (None: no
        limit); None if it cannot be made (the run is then watched by its RSS)."""
        path = os.path.join(self.base, owner, f"{job_id}.{run}")
        try:
            os.mkdir(path)
        except FileExistsError:
            pass  # left by a run of the same number: its processes were killed with its v2 cgroup
        except OSError:
            return None
        found = RunMemory(path, limit)
        try:
            if limit:
                cgroupfs.write(os.path.join(path, LIMIT), str(limit))
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
    procs: int = -1

    def started(self) -> None:
        if self.procs >= 0:
            os.close(self.procs)
            self.procs = -1

    def peak(self) -> int | None:
        """The most memory the run's processes held at once (bytes), as the kernel counts."""
        text = cgroupfs.read(os.path.join(self.path, PEAK))
        return int(text) if text is not None and text.strip().isdigit() else None

    def oom_kills(self) -> int:
        """How many of the run's processes the OOM killer took at its limit."""
        text = cgroupfs.read(os.path.join(self.path, OOM)) or b""
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
