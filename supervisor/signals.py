"""Signals reach the manager's loop as bytes on a wakeup pipe.

This is the only module that installs handlers. A handler does nothing: the
interpreter's C-level handler writes the signal number to the wakeup fd
(`signal.set_wakeup_fd`), and the loop reads and acts on it, so no logging or
I/O ever runs inside a handler.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub: the C half of `signal`, see below
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import FrameType

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGCHLD, signal.SIGHUP)
_SIGCHLD = int(signal.SIGCHLD)  # a plain int: one arrives per job, and enum lookups cost


def _record_only(signum: int, frame: FrameType | None) -> None:
    """The wakeup fd already carries the signal number; nothing to do here."""


class SignalPipe:
    """The read end of the wakeup pipe, and the handlers that feed it."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._previous = {signum: signal.signal(signum, _record_only) for signum in HANDLED}

    def drain(self) -> list[signal.Signals]:
        """The signals that arrived since the last call, in order, but SIGCHLD, which
        only wakes the loop (the loop reaps at every turn anyway)."""
        received = b""
        while True:  # a short read means the pipe is empty: no BlockingIOError to build per job
            try:
                chunk = os.read(self.read_fd, 4096)
            except BlockingIOError:
                break
            received += chunk
            if len(chunk) < 4096:
                break
        return [signal.Signals(number) for number in received if number != _SIGCHLD]

    @property
    def fds(self) -> tuple[int, int]:
        return self.read_fd, self._write_fd

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous_fd)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        os.close(self.read_fd)
        os.close(self._write_fd)


# Around every fork, the C functions themselves: `signal`'s wrappers turn each number
# and handler into an enum member (and fail into ValueError for a function handler),
# code that runs once per job in the manager and in every child, where each page it
# touches is a copy-on-write fault (docs/PERFORMANCE.md).
_pthread_sigmask: Callable[[int, Iterable[int]], set[int]] = _signal.pthread_sigmask
_set_handler: Callable[[int, int], object] = _signal.signal
_HANDLED_NUMBERS = tuple(int(signum) for signum in HANDLED)
_SIG_DFL = int(signal.SIG_DFL)


@contextmanager
def blocked() -> Iterator[set[int]]:
    """Block the handled signals (around fork, so none lands half way; in a sweeper, around
    each step, so that its manager's stop lands between two); yield the mask to restore,
    which a forked child must restore itself since it never leaves."""
    previous = _pthread_sigmask(signal.SIG_BLOCK, _HANDLED_NUMBERS)
    try:
        yield previous
    finally:
        _pthread_sigmask(signal.SIG_SETMASK, previous)


def reset_in_child(unblock_mask: set[int]) -> None:
    """In a fresh child: default handlers, no wakeup fd, the parent's mask restored."""
    signal.set_wakeup_fd(-1)
    for signum in _HANDLED_NUMBERS:
        _set_handler(signum, _SIG_DFL)
    _pthread_sigmask(signal.SIG_SETMASK, unblock_mask)
