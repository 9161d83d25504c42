"""What wakes the manager: signals and child exits (through the wakeup pipe), new
entries in `ready/` and `incoming/` and a new drain file (through inotify), and the
poll, a safety net that looks at everything every `poll_interval` (NFS, where
inotify sees no other host's change, or events the kernel dropped).

The signal pipe is opened first, so that from then on SIGTERM drains instead of
killing. The drain request seen at the start is not for this manager: only a
change of the drain file after it is (`forkvisor drain` renames a new file into
place each time, so a change is seen whatever the clocks' granularity).
"""

from __future__ import annotations

import logging
import selectors
import signal
import time
from collections.abc import Sequence

from jobs import DRAIN_FILE, PAUSE_FILE, Queue, State
from supervisor.signals import SignalPipe
from supervisor.watch import Watch, open_watch

log = logging.getLogger(__name__)


class Wakeup:
    """What the last wait found. One object, reset at each wait: the loop turns once or
    twice per job, and every object it makes is a page the manager may write after a
    fork (a copy-on-write fault, see docs/PERFORMANCE.md)."""

    __slots__ = ("drain", "incoming", "missed", "pause", "poll", "ready", "signals")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.signals: Sequence[signal.Signals] = ()
        self.ready: Sequence[str] = ()  # new names in ready/
        self.missed = False  # the kernel dropped events: ready/ must be scanned
        self.incoming = False  # members' submissions may wait in incoming/
        self.drain = False  # a new drain request stands in the queue folder
        self.pause = False  # the queue's pause file changed
        self.poll = False  # time for the safety net: look at everything


class Wakeups:
    """The manager's wait: a selector over the signal pipe and the inotify watch."""

    def __init__(self, queue: Queue, poll_interval: float) -> None:
        self.queue = queue
        self.poll_interval = poll_interval
        self.next_poll = 0.0
        self._drain_at_start: tuple[int, int] | None = None
        self._signals: SignalPipe | None = None
        self._selector: selectors.DefaultSelector | None = None
        self._watch: Watch | None = None
        self._found = Wakeup()

    def open_signals(self) -> None:
        """First of all: from now on a SIGTERM is read here (a drain), not the default (death)."""
        self._drain_at_start = self._drain_request(None)
        self._signals = SignalPipe()

    def open_watch(self) -> None:
        """Watch the queue once the manager is registered; inotify may be missing (the poll covers it)."""
        if self._signals is None:
            raise RuntimeError("open_signals() comes first")
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._signals.read_fd, selectors.EVENT_READ)
        folders = [self.queue.state_path(State.READY), self.queue.path, self.queue.state_path(State.INCOMING)]
        self._watch = open_watch(folders)
        if self._watch is not None:
            self._selector.register(self._watch.fd, selectors.EVENT_READ)

    @property
    def fds(self) -> list[int]:
        """Descriptors a child must not keep: the wakeup pipe, the selector, inotify."""
        fds = [*self._signals.fds] if self._signals is not None else []
        fds += [self._selector.fileno()] if self._selector is not None else []
        return fds + ([self._watch.fd] if self._watch is not None else [])

    def wait(self, timeout: float) -> Wakeup:
        """Wait up to `timeout` seconds; say what happened."""
        if self._selector is None or self._signals is None:
            raise RuntimeError("the manager waits only once started")
        readable = {key.fd for key, _ in self._selector.select(timeout)}
        found = self._found
        found.reset()
        if self._signals.read_fd in readable:  # else skip the read (every turn counts, see PERFORMANCE.md)
            found.signals = self._signals.drain()
        if self._watch is not None and self._watch.fd in readable:
            self._read_watch(found)
        self._poll_if_due(found, time.monotonic())
        return found

    def _poll_if_due(self, found: Wakeup, now: float) -> None:
        """Make `found` a poll when the poll interval is over, or events were lost."""
        if now >= self.next_poll or found.missed:
            self.next_poll = now + self.poll_interval
            found.poll = found.incoming = True
            found.drain = found.drain or self.drain_requested()

    def _read_watch(self, found: Wakeup) -> None:
        if self._watch is None:
            return
        ready, incoming = self.queue.state_path(State.READY), self.queue.state_path(State.INCOMING)
        names: list[str] = []
        found.ready = names
        for folder, name in self._watch.read():
            if folder is None:
                found.missed = True
            elif folder == ready:
                names.append(name)
            elif folder == incoming:
                found.incoming = True
            elif name == DRAIN_FILE:
                found.drain = found.drain or self.drain_requested()
            elif name == PAUSE_FILE:
                found.pause = True

    def drain_requested(self) -> bool:
        """Whether a drain file stands that was not there (as it is now) at the start."""
        return self._drain_request(self._drain_at_start) != self._drain_at_start

    def _drain_request(self, unchanged: tuple[int, int] | None) -> tuple[int, int] | None:
        try:
            return self.queue.drain_request()
        except OSError as exc:  # the queue folder turned unreadable: no request can be seen
            log.error("cannot look for a drain request in %s: %s", self.queue.path, exc)
            return unchanged

    def close(self) -> None:
        """Close the selector and the watch, and give the process its signal handlers back."""
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        if self._signals is not None:
            self._signals.close()
            self._signals = None
