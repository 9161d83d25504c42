"""File-system primitives the store is built from, and nothing else.

Invariants kept here:
- A move never replaces an existing entry: `move` uses renameat2 with
  RENAME_NOREPLACE, because plain rename(2) silently replaces an empty target
  directory. Where the file system refuses the flag (EINVAL), it falls back to
  "look, then rename", which is safe unless two writers race on the same name.
- Files we read are opened with O_NOFOLLOW and read up to a size limit, so a
  symlink or a huge file planted in a queue is never followed nor slurped.
- `checkpoint(name)` marks the points between the steps of a transition; tests
  install a hook there to kill the process at exactly that point.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

from jobs.errors import MoveCollision

# The hot paths pass plain strings: a Path built per file operation costs more than the syscall.
StrPath: TypeAlias = str | os.PathLike[str]

_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)
_syncfs = getattr(_libc, "syncfs", None)
_noreplace_supported = _renameat2 is not None

checkpoint_hook: Callable[[str], None] | None = None


def checkpoint(name: str) -> None:
    """Mark a point between two steps of a transition (a crash test hooks it)."""
    if checkpoint_hook is not None:
        checkpoint_hook(name)


def move(src: StrPath, dst: StrPath) -> None:
    """Rename `src` to `dst`, failing with MoveCollision if `dst` exists.

    Raises FileNotFoundError when `src` is gone (another process moved it first).
    """
    global _noreplace_supported
    if _noreplace_supported:
        if _renameat2_noreplace(src, dst):
            return
        _noreplace_supported = False  # this file system refused the flag
    if os.path.lexists(dst):
        raise MoveCollision(f"cannot move {src} to {dst}: {dst} already exists")
    os.rename(src, dst)


def _renameat2_noreplace(src: StrPath, dst: StrPath) -> bool:
    """Return False when the file system does not support RENAME_NOREPLACE."""
    assert _renameat2 is not None
    result = _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS):
        return False
    if err == errno.EEXIST:
        raise MoveCollision(f"cannot move {src} to {dst}: {dst} already exists")
    raise OSError(err, os.strerror(err), os.fspath(src), None, os.fspath(dst))


def fsync_dir(path: StrPath) -> None:
    """Make the entries of folder `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_filesystem(path: Path) -> None:
    """Flush everything written to the file system holding `path` (one barrier)."""
    if _syncfs is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), os.fspath(path))
    finally:
        os.close(fd)


PRIVATE = 0o600


def write_new(path: StrPath, data: bytes, *, durable: bool, mode: int = PRIVATE) -> None:
    """Create `path` (it must not exist) holding `data`; fsync it when durable."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        _widen(fd, mode)
        _write_all(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: StrPath, data: bytes, *, durable: bool, mode: int = PRIVATE) -> None:
    """Atomically set the content of `path`: write a dot-file beside it, rename over."""
    parent, name = os.path.split(os.fspath(path))
    tmp = os.path.join(parent, f".{name}.{os.getpid()}.tmp")
    try:
        try:
            write_new(tmp, data, durable=durable, mode=mode)
        except FileExistsError:  # a previous run of this pid died mid-write
            os.unlink(tmp)
            write_new(tmp, data, durable=durable, mode=mode)
    except OSError:
        unlink_if_there(tmp)  # disk full, say: leave no half-written dot-file behind
        raise
    os.replace(tmp, path)
    if durable:
        fsync_dir(parent or ".")


def unlink_if_there(path: StrPath) -> None:
    """Remove `path`; nothing to do if it is not there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def unlink_regular(path: StrPath) -> None:
    """Remove `path` if it is a regular file (never a link's target, never a folder)."""
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass


def append_line(path: StrPath, line: str, mode: int = PRIVATE) -> None:
    """Append one line to a log file (O_APPEND keeps concurrent lines whole)."""
    # O_NONBLOCK: a fifo planted in the file's place must not block the writer.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    try:
        if not _is_regular(fd):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        _widen(fd, mode)
        _write_all(fd, (line.rstrip("\n") + "\n").encode("utf-8", "backslashreplace"))
    finally:
        os.close(fd)


def read_limited(path: StrPath, limit: int) -> bytes:
    """Read a regular file without following a symlink; refuse one over `limit` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        if not _is_regular(fd):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        data = os.read(fd, limit + 1)
        chunks = [data]
        while data and sum(map(len, chunks)) <= limit:
            data = os.read(fd, limit + 1)
            chunks.append(data)
    finally:
        os.close(fd)
    content = b"".join(chunks)
    if len(content) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
    return content


def _widen(fd: int, mode: int) -> None:
    """Give a shared queue's file its group bits, which the umask may have taken away."""
    if mode != PRIVATE:
        os.fchmod(fd, mode)


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written == len(data):
        return  # the usual case for small files: no memoryview to build
    view = memoryview(data)[written:]
    while view:
        view = view[os.write(fd, view) :]
