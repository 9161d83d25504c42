"""A run's output, bounded: of its `stdout` and of its `stderr` a run keeps at most its
output limit (`output_limit`, 8M unless the job, its function or the queue say), the
head and the tail, with one line between them saying how much was dropped.

While the job runs, its manager punches the middle out of a file past the limit
(`bound`, at each of its checks, twice a second): the blocks go back to the file system,
while the file keeps its length and the job its offset, so what the job writes next lands
where it would have, and nothing races the job's own writes. A job writing faster than
the checks can hold at most what it writes between two of them. When the run has ended,
`compact` rewrites each file as its head, the line, and its tail (a staging file renamed
over: a crash leaves one or the other). Readers skip the holes of a running job's file
(`data_after`), saying what was dropped.

Where the file system cannot punch holes, nothing gives blocks back while the job runs:
its manager then stops a run once a stream holds more than its `ceiling` (its blocks, not
its length: a job that seeks far has a long file, not a full disk).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

from jobs.units import format_size

OUTPUT_FILES = ("stdout", "stderr")
_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (the kernel requires both)
_libc = ctypes.CDLL(None, use_errno=True)
_fallocate = getattr(_libc, "fallocate64", None) or getattr(_libc, "fallocate", None)
if _fallocate is not None:
    _fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def head_size(limit: int) -> int:
    return limit // 2


def tail_size(limit: int) -> int:
    return limit - head_size(limit)


def ceiling(limit: int) -> int:
    """What one stream of a run may hold on a file system that cannot punch holes before its
    manager stops the run: four times its limit, so that a job that overshoots its limit
    (whose middle is dropped at its end anyway) still ends as it would where holes can be
    punched, plus 16M, so that a small limit (1K) does not make a few pages fatal; what a
    run can take of the queue's disk stays bounded, by its output limit."""
    return 4 * limit + (16 << 20)


def allocated(run: int) -> int:
    """The most any of the run's output files holds on disk now (its blocks, in bytes)."""
    most = 0
    for name in OUTPUT_FILES:
        fd = _open(run, name, os.O_RDONLY)
        if fd is not None:
            try:
                most = max(most, os.fstat(fd).st_blocks * 512)
            finally:
                os.close(fd)
    return most


def bound(run: int, limit: int) -> None:
    """Give back the blocks of what a running job wrote past its limit, but its head and
    tail (the file keeps its length: the job's next write lands at its end)."""
    for name in OUTPUT_FILES:
        fd = _open(run, name, os.O_WRONLY)
        if fd is None:
            continue
        try:
            _punch_middle(fd, limit)
        finally:
            os.close(fd)


def _punch_middle(fd: int, limit: int) -> None:
    status = os.fstat(fd)
    if status.st_blocks * 512 <= limit + max(limit // 4, 64 << 10):  # slack: one punch per many writes
        return
    block = status.st_blksize or 4096
    start = -(-head_size(limit) // block) * block  # whole blocks only: the head and tail stay whole
    end = (status.st_size - tail_size(limit)) // block * block
    if end > start:
        _punch(fd, start, end - start)


def _punch(fd: int, offset: int, length: int) -> None:
    if _fallocate is None:
        raise OSError(errno.EOPNOTSUPP, "this C library has no fallocate")
    if _fallocate(fd, _PUNCH_HOLE, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def compact(run: int, limit: int) -> dict[str, int]:
    """Once the run has ended: rewrite each output file past `limit` as its head, a line
    saying what was dropped, and its tail. The bytes dropped, by file (those past it)."""
    dropped = {}
    for name in OUTPUT_FILES:
        try:
            if os.stat(name, dir_fd=run, follow_symlinks=False).st_size <= limit:
                continue  # the usual case, told without opening it (what is opened is checked below)
        except OSError:
            continue  # none there
        fd = _open(run, name, os.O_RDONLY)
        if fd is None:
            continue
        try:
            size = os.fstat(fd).st_size
            if size > limit:
                _rewrite(run, name, fd, size, limit)
                dropped[name] = size - limit
        finally:
            os.close(fd)
    return dropped


def dropped_line(name: str, dropped: int, limit: int | None = None) -> bytes:
    """The line that stands where a file's middle was dropped."""
    why = ""
    if limit:
        kept = f"the first {format_size(head_size(limit))} and the last {format_size(tail_size(limit))} are kept"
        why = f" (output_limit {format_size(limit)}: {kept})"
    return f"\n[forkvisor: {dropped} bytes of {name} dropped here{why}]\n".encode()


def _rewrite(run: int, name: str, fd: int, size: int, limit: int) -> None:
    staging = f".{name}.compact"
    try:
        os.unlink(staging, dir_fd=run)  # left by a manager that died here
    except FileNotFoundError:
        pass
    status = os.fstat(fd)
    mode = stat.S_IMODE(status.st_mode)
    new = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, mode, dir_fd=run)
    try:
        if os.geteuid() == 0 and (status.st_uid, status.st_gid) != (0, 0):
            os.fchown(new, status.st_uid, status.st_gid)  # a job run as its submitter keeps its own files
        os.fchmod(new, mode)
        _copy(fd, new, 0, head_size(limit))
        os.write(new, dropped_line(name, size - limit, limit))
        _copy(fd, new, size - tail_size(limit), tail_size(limit))
    except BaseException:
        os.close(new)
        os.unlink(staging, dir_fd=run)
        raise
    os.close(new)
    os.replace(staging, name, src_dir_fd=run, dst_dir_fd=run)


def _copy(src: int, dst: int, offset: int, count: int) -> None:
    """Copy `count` bytes of `src` from `offset` to the end of `dst`, in the kernel."""
    while count > 0:
        copied = os.copy_file_range(src, dst, count, offset)
        if copied == 0:
            return  # the file is shorter than its size said (truncated meanwhile)
        offset, count = offset + copied, count - copied


def _open(run: int, name: str, flags: int) -> int | None:
    """An output file of the run: a regular file with one name (what else stands there
    is the job's doing: a link or a fifo is never followed nor blocked on), or None."""
    try:
        fd = os.open(name, flags | _OPEN, dir_fd=run)
    except OSError:
        return None
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
        os.close(fd)
        return None
    return fd


def data_after(fd: int, offset: int) -> tuple[int, int]:
    """Where the data of `fd` resumes at or after `offset`, and where it stops next: a
    running job's output has a hole where its middle was dropped. (offset, offset) at
    its end."""
    try:
        start = os.lseek(fd, offset, os.SEEK_DATA)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no data after offset: the end, or a hole up to it
            return offset, offset
        raise
    return start, os.lseek(fd, start, os.SEEK_HOLE)
