"""The cgroup file system, as much of it as `containment` (cgroup v2, where runs live) and
`run_memory` (cgroup v1's memory hierarchy, where their memory is limited) need: where a
hierarchy is mounted, this process's cgroup in it, the folder below it that this process
may divide, and reading and writing a cgroup's files.

Everything is read as bytes: a manager that dropped its privileges may no longer be able
to import a codec.
"""

from __future__ import annotations

import errno
import os

FOLDER = "forkvisor"  # below the manager's own cgroup: the runs of this host's managers
LEAF = "forkvisor-managers"  # beside it, on cgroup v2: where managers sit so that their cgroup may lend controllers


def mount(kind: bytes, controller: bytes | None = None) -> str | None:
    """Where the hierarchy of file system `kind` is mounted (b"cgroup2"; or b"cgroup", the
    v1 one that holds `controller`), or None."""
    try:
        with open("/proc/self/mountinfo", "rb") as mounts:
            for line in mounts:
                before, _, after = line.partition(b" - ")
                fields = after.split()
                if not fields or fields[0] != kind:
                    continue
                if controller is None or (len(fields) >= 3 and controller in fields[2].split(b",")):
                    return os.fsdecode(before.split(b" ")[4]).replace("\\040", " ")
    except OSError:
        pass
    return None


def favors_moves(mountinfo: bytes) -> bool:
    """Whether the cgroup v2 hierarchy in `mountinfo` (/proc/self/mountinfo's text) is mounted
    with `favordynmods` (Linux 6.0+): then moving a process into a cgroup never waits for one of
    the kernel's RCU grace periods, which takes up to ~10 ms (docs/DEPLOYING.md, "Latency")."""
    for line in mountinfo.splitlines():
        fields = line.partition(b" - ")[2].split()
        if len(fields) >= 3 and fields[0] == b"cgroup2":
            return b"favordynmods" in fields[2].split(b",")
    return False


def own(at: str, controller: bytes | None = None) -> str | None:
    """This process's cgroup, as a folder below the mount `at`: its v2 cgroup (no
    `controller`; the one above if this process sits in its `LEAF`), else its cgroup in
    the v1 hierarchy holding `controller`; None if none."""
    try:
        with open("/proc/self/cgroup", "rb") as groups:
            for line in groups:
                hierarchy, controllers, path = line.rstrip(b"\n").split(b":", 2)
                if _is_ours(hierarchy, controllers, controller):
                    found = os.path.join(at, os.fsdecode(path).lstrip("/"))
                    leaf = controller is None and os.path.basename(found) == LEAF
                    return os.path.dirname(found) if leaf else found
    except (OSError, ValueError):
        pass
    return None


def _is_ours(hierarchy: bytes, controllers: bytes, controller: bytes | None) -> bool:
    """Whether a line of /proc/self/cgroup names the hierarchy asked for: v2's ("0::") or
    the v1 one holding `controller`."""
    if controller is None:
        return hierarchy == b"0" and controllers == b""
    return controller in controllers.split(b",")


def divisible(own_cgroup: str) -> tuple[str | None, str]:
    """`FOLDER` below `own_cgroup`, made if missing, if this process may make cgroups there;
    else None and why not (the kernel's word)."""
    base = os.path.join(own_cgroup, FOLDER)
    probe = os.path.join(base, f".probe.{os.getpid()}")
    try:
        os.makedirs(base, exist_ok=True)
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as exc:
        return None, exc.strerror or str(exc)
    return base, ""


def read(path: str, most: int = 65536) -> bytes | None:
    """A cgroup file's content (at most `most` bytes), or None if it cannot be read. (Read
    with bare descriptors: the manager reads a few of these at each run's end.)"""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks: list[bytes] = []
        left = most
        while left > 0 and (chunk := os.read(fd, min(left, 65536))):  # (os.read allocates what it asks for)
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def write(path: str, text: str) -> None:
    """Write one value into a cgroup file (the kernel takes it whole); OSError if refused."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def lend(own_cgroup: str, base: str, controller: str) -> str:
    """Enable `controller` (b"memory") for the cgroups below `base` (`FOLDER` below
    `own_cgroup`): in the `cgroup.subtree_control` of both (an owner's folder below `base`
    is done as it is made: `enable`). cgroup v2 lends a controller only to the children
    of a cgroup that holds no process itself (its root aside), so if this process is in
    `own_cgroup`, it first moves into `LEAF` beside `base`. "" once done, else why not."""
    if controller.encode() not in (read(os.path.join(own_cgroup, "cgroup.controllers")) or b"").split():
        return f"its cgroup {own_cgroup} was given no {controller} controller (cgroup.controllers)"
    try:
        enable(own_cgroup, controller)
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            return f"cannot enable {controller} below {own_cgroup}: {exc.strerror}"
        try:
            os.makedirs(os.path.join(own_cgroup, LEAF), exist_ok=True)
            write(os.path.join(own_cgroup, LEAF, "cgroup.procs"), "0")
            enable(own_cgroup, controller)
        except OSError as again:
            return f"cannot enable {controller} below {own_cgroup}: {again.strerror} (other processes are in it)"
    try:
        enable(base, controller)
    except OSError as exc:
        return f"cannot enable {controller} below {base}: {exc.strerror}"
    return ""


def enable(cgroup: str, controller: str) -> None:
    """Lend `controller` to the cgroups below `cgroup`; OSError if the kernel refuses."""
    write(os.path.join(cgroup, "cgroup.subtree_control"), f"+{controller}")
