"""Who may do what in a queue folder: the modes that carry the model, and the checks a
manager makes before it serves a queue (docs/SECURITY.md has the reasoning).

A queue has one owner, the account its managers run as. A private queue is the
owner's alone. A shared queue belongs to the owner and is readable by one group,
whose members may submit and do nothing else: the only folder they can write is
`incoming/`, which is sticky, so each removes only what they put there. Everything
that decides what runs (`queue.json`) and every job folder is the owner's.

    shared queue               owner  group  other   why
    QUEUE/                     rwx    r-x    ---     setgid: what is made inside keeps the group
    queue.json                 rw-    r--    ---
    incoming/                  rwx    rwx    ---     sticky: a member removes only their own
    tmp/ ready/ scheduled/ claimed/ done/ dead/ quarantine/
                               rwx    r-x    ---
    job folders and files      rwx    r-x    ---     (files rw- r-- ---)

A manager refuses to serve a queue whose folder, marker or state folders someone
else owns or may write (but `incoming/` of a shared queue): whoever could write them
could change what runs, or redirect the manager's writes.
"""

from __future__ import annotations

import os
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
SHARED = Layout(root=0o2750, marker=0o640, incoming=0o3770, folder=0o2750, file=0o640)


def layout(shared: bool) -> Layout:
    return SHARED if shared else PRIVATE


def problems(root: Dir, marker: str, folders: list[str], uid: int) -> list[str]:
    """Why a manager running as `uid` must not serve the queue opened as `root` (empty if it may)."""
    found = _unsafe(os.fstat(root.fd), "the queue folder", uid, allow_group_write=False)
    for name in [marker, *folders]:
        try:
            status = root.lstat(name)
        except FileNotFoundError:
            continue  # made when the queue is opened for writing
        what = name if name == marker else f"{name}/"
        found += _unsafe(status, what, uid, allow_group_write=name == INCOMING)
    return found


def _unsafe(status: os.stat_result, what: str, uid: int, *, allow_group_write: bool) -> list[str]:
    mode = stat.S_IMODE(status.st_mode)
    if status.st_uid != uid:
        return [f"{what} belongs to uid {status.st_uid}, not to this manager's uid {uid}"]
    if stat.S_ISLNK(status.st_mode):
        return [f"{what} is a link: a queue's folders and marker must be its own"]
    if mode & 0o002:
        return [f"{what} is writable by every user (mode {mode:04o})"]
    if mode & 0o020 and not (allow_group_write and mode & stat.S_ISVTX):
        return [f"{what} is writable by its group (mode {mode:04o})"]
    return []


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
