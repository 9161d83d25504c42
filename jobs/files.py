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
import logging
import os
import stat
from collections.abc import Callable
from typing import TypeAlias

from jobs.errors import InternalError, MoveCollision

# The hot paths pass plain strings: a Path built per file operation costs more than the syscall.
StrPath: TypeAlias = str | os.PathLike[str]

_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)
_syncfs = getattr(_libc, "syncfs", None)
_noreplace_supported = _renameat2 is not None

checkpoint_hook: Callable[[str], None] | None = None
log = logging.getLogger(__name__)


def checkpoint(name: str) -> None:
    """Mark a point between two steps of a transition (a crash test hooks it)."""
    if checkpoint_hook is not None:
        checkpoint_hook(name)


def move(src: StrPath, dst: StrPath, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
    """Rename `src` to `dst` (each relative to its folder handle when given), failing with
    MoveCollision if `dst` exists.

    Raises FileNotFoundError when `src` is gone (another process moved it first).
    """
    global _noreplace_supported
    if _noreplace_supported:
        if _renameat2_noreplace(src, dst, _at(src_dir_fd), _at(dst_dir_fd)):
            return
        _noreplace_supported = False  # this file system refused the flag
    if _lexists(dst, dst_dir_fd):
        raise MoveCollision(f"cannot move {src} to {dst}: {dst} already exists")
    os.rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)


def _renameat2_noreplace(src: StrPath, dst: StrPath, src_fd: int, dst_fd: int) -> bool:
    """Return False when the file system does not support RENAME_NOREPLACE."""
    if _renameat2 is None:
        raise InternalError("renameat2 was called where the C library has none: a bug in forkvisor")
    result = _renameat2(src_fd, os.fsencode(src), dst_fd, os.fsencode(dst), _RENAME_NOREPLACE)
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS):
        return False
    if err == errno.EEXIST:
        raise MoveCollision(f"cannot move {src} to {dst}: {dst} already exists")
    raise OSError(err, os.strerror(err), os.fspath(src), None, os.fspath(dst))


def _at(dir_fd: int | None) -> int:
    return _AT_FDCWD if dir_fd is None else dir_fd


def _lexists(path: StrPath, dir_fd: int | None) -> bool:
    try:
        os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def fsync_dir(path: StrPath, dir_fd: int | None = None) -> None:
    """Make the entries of folder `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: StrPath, dir_fd: int | None = None) -> None:
    """Make the data of the file `path` durable (never through a link, never blocking on a fifo)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_folder(fd: int) -> None:
    """Make the entries of the folder open as `fd` durable: one barrier."""
    os.fsync(fd)


def sync_filesystem(folder: StrPath | int) -> None:
    """Flush everything written to the file system holding `folder` (a path or an open
    folder's descriptor): one barrier."""
    if _syncfs is None:
        os.sync()
        return
    fd = folder if isinstance(folder, int) else os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), None if isinstance(folder, int) else os.fspath(folder))
    finally:
        if not isinstance(folder, int):
            os.close(fd)


PRIVATE = 0o600


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_new(path: StrPath, data: bytes, *, durable: bool, mode: int = PRIVATE, dir_fd: int | None = None) -> None:
    """Create `path` (it must not exist) holding `data`; fsync it when durable."""
    fd = os.open(path, _NEW_FILE, mode, dir_fd=dir_fd)
    try:
        _widen(fd, mode)
        _write_all(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def link_new(name: str, data: bytes, *, durable: bool, mode: int = PRIVATE, dir_fd: int) -> bool:
    """Create `name` in the folder `dir_fd` holding `data`, whole or not at all, unless it
    exists: False then. Written under a dot-name and linked into place, as `link(2)` never
    replaces, on NFS too (where O_EXCL may not hold): of two writers racing, one wins. The
    caller fsyncs the folder when the new name must be durable."""
    staging = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    write_new(staging, data, durable=durable, mode=mode, dir_fd=dir_fd)
    try:
        os.link(staging, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except FileExistsError:
        return False
    finally:
        unlink_if_there(staging, dir_fd)
    return True


def staging_name(name: str) -> str:
    """The dot-name `replace_file` writes `name` under before renaming it into place."""
    return f".{name}.{os.getpid()}.tmp"


def replace_file(path: StrPath, data: bytes, *, durable: bool, mode: int = PRIVATE, dir_fd: int | None = None) -> None:
    """Atomically set the content of `path`: write a dot-file beside it, rename over (which
    replaces a link standing there, never its target). With `dir_fd`, `path` is a name in
    that folder."""
    parent, name = os.path.split(os.fspath(path))
    tmp = os.path.join(parent, staging_name(name))
    try:
        try:
            write_new(tmp, data, durable=durable, mode=mode, dir_fd=dir_fd)
        except FileExistsError:  # a previous run of this pid died mid-write
            os.unlink(tmp, dir_fd=dir_fd)
            write_new(tmp, data, durable=durable, mode=mode, dir_fd=dir_fd)
    except OSError:
        unlink_if_there(tmp, dir_fd)  # disk full, say: leave no half-written dot-file behind
        raise
    os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    if durable:
        if dir_fd is not None and not parent:
            os.fsync(dir_fd)
        else:
            fsync_dir(parent or ".", dir_fd)


def unlink_if_there(path: StrPath, dir_fd: int | None = None) -> None:
    """Remove `path`; nothing to do if it is not there."""
    try:
        os.unlink(path, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def remove_tree(path: StrPath, budget: int | None = None, dir_fd: int | None = None) -> bool:
    """Remove the folder `path` and all it holds: without recursion (a tree a hundred thousand
    levels deep), without following a link (a link is removed, never its target), with at most
    two descriptors open. Going back up, each folder is checked to be the one it came down
    from, so a tree moved meanwhile stops the removal instead of steering it elsewhere.

    With a `budget`, stop after removing about that many entries and return False: the caller
    finishes the tree later (a sweep must not spend minutes on one tree). Going down costs no
    budget, so every call removes something. True once `path` is gone (or was). OSError if it
    is not a folder or cannot be removed. With `dir_fd`, `path` is a name in that folder."""
    left = [float("inf") if budget is None else budget]
    parent, top = os.path.split(os.fspath(path).rstrip("/"))
    parent_fd = os.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        try:
            fd = _open_subdir(parent_fd, top)
        except FileNotFoundError:
            return True
        trail = [(top, _identity(fd))]  # the names and identities from `top` down to `fd`
        while True:
            below = _clear_files(fd, left)
            if left[0] <= 0:
                os.close(fd)
                return False
            if below is not None:
                try:
                    child = _open_subdir(fd, below)
                except FileNotFoundError:
                    continue  # another remover of this tree took it first
                trail.append((below, _identity(child)))
                os.close(fd)
                fd = child
                continue
            name, _ = trail.pop()
            left[0] -= 1
            if not trail:
                os.close(fd)
                _rmdir_if_there(name, parent_fd)
                return True
            up = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = up
            if _identity(fd) != trail[-1][1]:
                raise OSError(errno.ESTALE, "the tree being removed was moved meanwhile", os.fspath(path))
            _rmdir_if_there(name, fd)
    finally:
        os.close(parent_fd)


def remove_quietly(path: StrPath, budget: int | None = None, dir_fd: int | None = None) -> None:
    """`remove_tree`, logging instead of raising: what is left, a later sweep finishes."""
    try:
        remove_tree(path, budget, dir_fd)
    except OSError as exc:
        log.warning("cannot remove %s yet: %s", path, exc)


def _rmdir_if_there(name: str, dir_fd: int) -> None:
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass  # another remover of this tree took it first


def _open_subdir(dir_fd: int, name: str) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def _identity(fd: int) -> tuple[int, int]:
    status = os.fstat(fd)
    return status.st_dev, status.st_ino


def _clear_files(dir_fd: int, left: list[float]) -> str | None:
    """Unlink the entries of the folder that are not folders, counting them off `left` and
    stopping when it runs out; return one subfolder's name, if any."""
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                return entry.name
            if left[0] <= 0:
                return None
            try:
                os.unlink(entry.name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass  # removed meanwhile
            left[0] -= 1
    return None


def unlink_regular(path: StrPath, dir_fd: int | None = None) -> None:
    """Remove `path` if it is a regular file (never a link's target, never a folder)."""
    try:
        if stat.S_ISREG(os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            os.unlink(path, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def append_line(
    path: StrPath, line: str, mode: int = PRIVATE, dir_fd: int | None = None, *, durable: bool = False
) -> None:
    """Append one line to a log file (O_APPEND keeps concurrent lines whole); durable: on
    disk when this returns (and the file's name, when this made it)."""
    # O_NONBLOCK: a fifo planted in the file's place must not block the writer.
    fd = os.open(path, _APPEND, mode, dir_fd=dir_fd)
    try:
        if not _is_regular(fd):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        _widen(fd, mode)
        data = (line.rstrip("\n") + "\n").encode("utf-8", "backslashreplace")
        _write_all(fd, data)
        if durable:
            os.fsync(fd)
            if os.fstat(fd).st_size == len(data):  # this line made the file: its name too
                fsync_dir(os.path.dirname(os.fspath(path)) or ".", dir_fd)
    finally:
        os.close(fd)


def read_limited(path: StrPath, limit: int, dir_fd: int | None = None) -> bytes:
    """Read a regular file without following a symlink; refuse one over `limit` bytes."""
    return read_regular(path, limit, dir_fd)[0]


def read_regular(path: StrPath, limit: int, dir_fd: int | None = None) -> tuple[bytes, os.stat_result]:
    """The safe reader: a regular file's content and status, never through a link, never
    blocking on a fifo or reading a device, never more than `limit` bytes (OSError else)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
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
    return content, status


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
