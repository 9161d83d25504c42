"""Seeing new jobs without busy polling: inotify on `ready/` and the queue root.

inotify tells us each new name in `ready/`, which goes straight into the
claim index. It only sees changes made through this kernel, so on NFS a job
published by another host is found by the slow poll the manager keeps as a
safety net. Where inotify is missing altogether, the poll is all there is.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Iterator
from pathlib import Path

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
IN_CREATE = 0x100
IN_MOVED_TO = 0x80
IN_DELETE = 0x200
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000  # the watch is gone (its folder removed, or inotify_rm_watch)
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
_HEADER = struct.Struct("iIII")
_libc = ctypes.CDLL(None, use_errno=True)


class Watch:
    """An inotify descriptor watching some folders for new entries."""

    def __init__(self, folders: list[Path]) -> None:
        self.fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._folders: dict[int, Path | str] = {}
        try:
            for folder in folders:
                self.add(folder)
        except OSError:
            os.close(self.fd)
            raise

    def add(self, folder: Path | str, mask: int = IN_CREATE | IN_MOVED_TO) -> int:
        """Watch one more folder for `mask`'s events (new entries by default), never through a
        link standing at its name; return the watch's descriptor."""
        wd: int = _libc.inotify_add_watch(self.fd, os.fsencode(folder), mask | IN_ONLYDIR | IN_DONT_FOLLOW)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot watch {folder}: {os.strerror(err)}")
        self._folders[wd] = folder
        return wd

    def remove(self, wd: int) -> None:
        """Stop watching what `add` returned `wd` for (quietly: the folder may be gone)."""
        if self._folders.pop(wd, None) is not None:
            _libc.inotify_rm_watch(self.fd, wd)

    @property
    def watched(self) -> int:
        return len(self._folders)

    def read(self) -> Iterator[tuple[Path | str | None, str]]:
        """(folder, name) of each new (or, where watched for, removed) entry; (None, "") when events were lost."""
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            yield from self._parse(data)

    def _parse(self, data: bytes) -> Iterator[tuple[Path | str | None, str]]:
        offset = 0
        while offset < len(data):
            wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            offset += _HEADER.size
            name = data[offset : offset + length].rstrip(b"\0")
            offset += length
            if mask & IN_Q_OVERFLOW:
                yield None, ""
            elif mask & IN_IGNORED:
                self._folders.pop(wd, None)  # its folder went: the slot is free for another
            elif wd in self._folders:
                yield self._folders[wd], os.fsdecode(name)

    def close(self) -> None:
        os.close(self.fd)


def open_watch(folders: list[Path]) -> Watch | None:
    """A Watch, or None where inotify is not available (the poll covers it)."""
    try:
        return Watch(folders)
    except OSError:
        return None
