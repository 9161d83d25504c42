"""Folder handles: a queue's folders opened once, and every name inside them reached
through the handle, never through a path looked up again.

A path is resolved anew each time it is used, so whoever can rename a folder between two
uses (a link put in its place) steers the second use elsewhere. A handle is the folder
itself: opened with O_NOFOLLOW, and every open, rename and unlink below it is made
relative to it (`dir_fd=`), one name at a time, each opened with O_NOFOLLOW in turn. (That
is what openat2's RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS would give; opening one name per
step gives it on every kernel.) Nothing renamed after the open can redirect a write, and a
folder replaced while it is in use is detected: its name no longer leads to the handle's
device and inode (`Dir.replaced`).
"""

from __future__ import annotations

import os
import stat
from typing import NamedTuple

from jobs import files

OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SEARCH_ONLY = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Dir:
    """An opened folder: its descriptor (`fd`) and the path it was opened by (for messages
    and for programs that need a path). Most live for one `with` block, on every job's
    path, so a handle is as light as can be: a handle dropped unclosed is closed when it
    is collected."""

    __slots__ = ("_identity", "fd", "path")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path
        self._identity: tuple[int, int] | None = None

    @property
    def identity(self) -> tuple[int, int]:
        """The folder's device and inode, read the first time they are asked for."""
        if self._identity is None:
            status = os.fstat(self.fd)
            self._identity = (status.st_dev, status.st_ino)
        return self._identity

    def pinned(self) -> Dir:
        """This handle, its identity read now: what `replaced` compares the name with later."""
        _ = self.identity
        return self

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, follow: bool = False) -> Dir:
        """Open the folder `path`; unless `follow`, its last part must not be a link (OSError).
        (A queue's own folder is opened following the path its user named: resolved once,
        as any program resolves its arguments, and checked through the handle.)"""
        flags = OPEN_DIR & ~os.O_NOFOLLOW if follow else OPEN_DIR
        return cls(os.open(path, flags), os.path.abspath(path)).pinned()

    def sub(self, name: str) -> Dir:
        """Open the folder `name` inside this one (`name` may hold several parts, each reached
        without following a link)."""
        return Dir(open_below(self.fd, name), f"{self.path}/{name}")

    def search_only(self, name: str) -> Dir:
        """Open the folder `name` inside this one for reaching names in it, where this user may
        enter it but not list it (a member and a shared queue's `incoming/`): a handle that
        serves the *at calls (lstat, mkdir, open below) and nothing that reads the folder."""
        return Dir(os.open(name, _SEARCH_ONLY, dir_fd=self.fd), f"{self.path}/{name}")

    def __truediv__(self, name: str) -> Entry:
        return Entry(self, name)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fsync(self) -> None:
        """Make this folder's entries durable."""
        files.sync_folder(self.fd)

    def names(self) -> list[str]:
        return os.listdir(self.fd)

    def scandir(self) -> os._ScandirIterator[str]:
        """The entries of this folder (their `.path` is their bare name)."""
        return os.scandir(self.fd)

    def lstat(self, name: str) -> os.stat_result:
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def exists(self, name: str) -> bool:
        """Whether `name` is in this folder (a link counts: it is not followed)."""
        try:
            self.lstat(name)
        except FileNotFoundError:
            return False
        return True

    def is_dir(self, name: str) -> bool:
        """Whether `name` is a folder in this one (a link to a folder is not)."""
        try:
            return stat.S_ISDIR(self.lstat(name).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def replaced(self, name: str, parent: Dir | None = None, *, follow: bool = False) -> str | None:
        """Why the folder now found at `name` (in `parent`, or the path `name`) is not this
        handle's folder; None while it still is."""
        try:
            status = os.stat(name, dir_fd=None if parent is None else parent.fd, follow_symlinks=follow)
        except FileNotFoundError:
            return "it is gone (moved or removed)"
        except OSError:
            return None  # cannot be looked at now (permissions): no sign that it was replaced
        if stat.S_ISLNK(status.st_mode):
            return "a link now stands in its place"
        if (status.st_dev, status.st_ino) != self.identity:
            return "another folder now stands in its place"
        return None

    def __repr__(self) -> str:
        return f"Dir({self.path!r}, fd={self.fd})"


class Borrowed(Dir):
    """A handle of a descriptor its caller keeps and closes: leaving a `with` block, or
    being collected, leaves the descriptor open."""

    __slots__ = ()

    def close(self) -> None:
        self.fd = -1

    def __del__(self) -> None:
        pass


def open_below(dir_fd: int, name: str) -> int:
    """The descriptor of folder `name` below the folder `dir_fd`, each of its parts opened
    without following a link (a plain descriptor, for the code of a job's child, where every
    object costs a copy-on-write fault)."""
    fd = dir_fd
    try:
        for part in name.split("/"):
            opened = os.open(part, OPEN_DIR, dir_fd=fd)
            if fd != dir_fd:
                os.close(fd)
            fd = opened
    except BaseException:
        if fd != dir_fd:
            os.close(fd)
        raise
    return fd


class Entry(NamedTuple):
    """A name inside an opened folder: where a job, a file or a folder of the queue is."""

    dir: Dir
    name: str

    @property
    def path(self) -> str:
        """The path it was reached by, for messages and display only."""
        return f"{self.dir.path}/{self.name}"

    def open(self) -> Dir:
        """Open this entry as a folder (each part without following a link)."""
        return self.dir.sub(self.name)

    def exists(self) -> bool:
        return self.dir.exists(self.name)

    def is_dir(self) -> bool:
        return self.dir.is_dir(self.name)

    def lstat(self) -> os.stat_result:
        return self.dir.lstat(self.name)
