"""Who may do what in a queue folder: the modes that carry the model, and the checks a
manager makes before it serves a queue (docs/SECURITY.md has the reasoning).

A queue has one owner, the account its managers run as. A private queue is the
owner's alone. A shared queue belongs to the owner and is readable by one group (the
queue's group), whose members may submit and do nothing else: the only folder they can
write is `incoming/`, where each makes a folder of their own (`jobs.incoming`). Everything
that decides what runs (`queue.json`) and every job folder is the owner's.

    shared queue               owner  group  other   why
    QUEUE/                     rwx    r-x    ---     the queue's group; setgid: what is made inside keeps it
    queue.json                 rw-    r--    ---
    incoming/                  rwx    rwx    -wx     the owner group; sticky, setgid (below)
    incoming/NAME/             rwx    rwx    ---     a member's own (they make it); the owner group, inherited
    tmp/ ready/ scheduled/ claimed/ done/ dead/ quarantine/ ...
                               rwx    r-x    ---
    job folders and files      rwx    r-x    ---     (files rw- r-- ---)

`incoming/` is in the owner group: a group only the owner is in (its own group, as
most systems give every user). Members reach `incoming/` through the queue folder, which
only the queue's group may enter, and there they are "other": they may add a name (their
folder) but not list the folder, and the sticky bit keeps each from moving or removing
anyone else's. A folder a member makes there inherits the owner group (setgid), so that
the owner's managers, and no other member, may take submissions out of it: whoever
stands in a member's folder, its owner put it there (`jobs.incoming`).

A manager refuses to serve a queue whose folder, marker or state folders someone
else owns or may write (but `incoming/` of a shared queue, as above): whoever could
write them could change what runs, or redirect the manager's writes.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass

from jobs.handles import Dir

INCOMING = "incoming"  # State.INCOMING's folder


@dataclass(frozen=True)
class Layout:
    """The modes of one kind of queue."""

    root: int
    marker: int
    incoming: int
    folder: int  # every other folder of the queue, job folders included
    file: int

    def of_folder(self, name: str) -> int:
        return self.incoming if name == INCOMING else self.folder


PRIVATE = Layout(root=0o700, marker=0o600, incoming=0o700, folder=0o700, file=0o600)
SHARED = Layout(root=0o2750, marker=0o640, incoming=0o3773, folder=0o2750, file=0o640)


def layout(shared: bool) -> Layout:
    return SHARED if shared else PRIVATE


def problems(root: Dir, marker: str, folders: list[str], uid: int) -> list[str]:
    """Why a manager running as `uid` must not serve the queue opened as `root` (empty if it may)."""
    top = os.fstat(root.fd)
    found = _unsafe(top, "the queue folder", uid)
    for name in [marker, *folders]:
        try:
            status = root.lstat(name)
        except FileNotFoundError:
            continue  # made when the queue is opened for writing
        if name == INCOMING and stat.S_IMODE(status.st_mode) != PRIVATE.incoming:
            found += _incoming_unsafe(top, status, uid)
        else:
            found += _unsafe(status, name if name == marker else f"{name}/", uid)
    return found


def _unsafe(status: os.stat_result, what: str, uid: int) -> list[str]:
    mode = stat.S_IMODE(status.st_mode)
    if status.st_uid != uid:
        return [f"{what} belongs to uid {status.st_uid}, not to this manager's uid {uid}"]
    if stat.S_ISLNK(status.st_mode):
        return [f"{what} is a link: a queue's folders and marker must be its own"]
    if mode & 0o002:
        return [f"{what} is writable by every user (mode {mode:04o})"]
    if mode & 0o020:
        return [f"{what} is writable by its group (mode {mode:04o})"]
    return []


def _incoming_unsafe(top: os.stat_result, status: os.stat_result, uid: int) -> list[str]:
    """Why a shared queue's `incoming/` cannot say who submitted what (see the module's docstring)."""
    mode = stat.S_IMODE(status.st_mode)
    fix = "; run `forkvisor init QUEUE --shared` as its owner to set it right"
    if status.st_uid != uid or stat.S_ISLNK(status.st_mode):
        return _unsafe(status, "incoming/", uid)
    if mode & (stat.S_ISVTX | stat.S_ISGID) != stat.S_ISVTX | stat.S_ISGID:
        return [f"incoming/ must be sticky and setgid (mode {mode:04o}, not 3773){fix}"]
    if stat.S_IMODE(top.st_mode) & 0o007:
        return [f"the queue folder is open to every user (mode {stat.S_IMODE(top.st_mode):04o}), not to its group only"]
    others = owner_group_members(status.st_gid, uid, every_user=True)
    if others:
        return [
            f"incoming/'s group {_group_name(status.st_gid)} has members besides the owner ({', '.join(others[:5])}), "
            f"who could write each other's submission folders and pass for each other{fix}"
        ]
    return []


def owner_group_members(gid: int, owner: int, every_user: bool) -> list[str]:
    """The users of group `gid` other than `owner` (by name): its listed members and, with
    `every_user`, those whose own group it is (that needs the whole user list: `init` only)."""
    try:
        owner_name = pwd.getpwuid(owner).pw_name
    except KeyError:
        owner_name = str(owner)
    try:
        members = {name for name in grp.getgrgid(gid).gr_mem if name != owner_name}
    except KeyError:
        return []
    if every_user:
        members |= {user.pw_name for user in pwd.getpwall() if user.pw_gid == gid and user.pw_uid != owner}
    return sorted(members)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def tighten(root: Dir, marker: str, folders: list[str], shape: Layout) -> list[str]:
    """Give the queue's own folder, marker and state folders the modes of `shape`; return
    what changed (the owner may; job folders keep their modes)."""
    changed = []
    targets = [(".", shape.root), (marker, shape.marker)] + [(name, shape.of_folder(name)) for name in folders]
    for name, mode in targets:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=root.fd)
        except FileNotFoundError:
            continue
        try:
            current = stat.S_IMODE(os.fstat(fd).st_mode)
            if current != mode:
                os.fchmod(fd, mode)  # through the descriptor: never a link's target
                shown = os.path.basename(root.path) if name == "." else name
                changed.append(f"{shown}: {current:04o} -> {mode:04o}")
        finally:
            os.close(fd)
    return changed
