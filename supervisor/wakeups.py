"""What wakes the manager: signals and child exits (through the wakeup pipe), and in
each queue it serves new entries in `ready/` and `incoming/`, a new drain file or a
changed pause file (through inotify, one watch per queue), and the poll, a safety
net that looks at everything every `poll_interval` (NFS, where inotify sees no
other host's change, or events the kernel dropped).

The signal pipe is opened first, so that from then on SIGTERM drains instead of
killing. The drain request seen at the start is not for this manager: only a
change of the drain file after it is (`forkvisor drain` renames a new file into
place each time, so a change is seen whatever the clocks' granularity).
"""

from __future__ import annotations

import logging
import select
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from jobs import CANCEL_FILE, DRAIN_FILE, FREEZE_FILE, PAUSE_FILE, Queue, State
from supervisor.bell import Bell
from supervisor.errors import InternalError
from supervisor.running import Running
from supervisor.signals import SignalPipe
from supervisor.watch import IN_CREATE, IN_DELETE, IN_MOVED_TO, Watch, open_watch

log = logging.getLogger(__name__)
StartedSince = Callable[[int, float], int]  # (queue index, monotonic time) -> children of it started since
MEMBER_WATCHES = 1000  # members' folders watched per queue (each costs a kernel watch of the user's)
# How long a job runs before its folder is watched for an operator's marks: most jobs end
# sooner, and a watch costs two calls through ctypes (and, in a manager that forks, the pages
# they write). A mark made meanwhile is looked for once the watch is up (`QueueWatch.follow_due`).
FOLLOW_AFTER = 0.05


class News:
    """What the last wait found in one queue. One object per queue, reset at each wait: the
    loop turns once or twice per job, and every object it makes is a page the manager may
    write after a fork (a copy-on-write fault, see docs/PERFORMANCE.md)."""

    __slots__ = ("drain", "incoming", "marked", "missed", "pause", "poll", "ready", "rung")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.ready: Sequence[str] = ()  # new names in ready/
        self.rung = False  # the doorbell woke this manager: ready/ has news (`supervisor.bell`)
        self.missed = False  # the kernel dropped events: ready/ must be scanned
        self.incoming = False  # members' submissions may wait in incoming/
        self.drain = False  # a new drain request stands in the queue folder
        self.pause = False  # the queue's pause file changed
        self.poll = False  # time for the safety net: look at everything
        self.marked: Sequence[str] = ()  # running jobs whose folder gained (or lost) a `cancel` or `frozen` mark


class Wakeup:
    """What the last wait found: the signals, and the news of each queue (in the order served)."""

    __slots__ = ("queues", "signals")

    def __init__(self, queues: list[News]) -> None:
        self.signals: Sequence[signal.Signals] = ()
        self.queues = queues


class QueueWatch:
    """The manager's eyes on one queue: inotify on `incoming/` and the queue folder (the
    drain and pause files), on `ready/` where this manager leads its host's managers of the
    queue (else the doorbell, `supervisor.bell`), and the poll."""

    def __init__(self, queue: Queue, poll_interval: float, index: int = 0) -> None:
        self.queue, self.index = queue, index  # (its place among the manager's queues)
        self.poll_interval = poll_interval
        self.next_poll = 0.0
        self.news = News()
        self.watch: Watch | None = None
        self.bell: Bell | None = None
        self.free = 0  # the jobs of this queue the manager could start now (it listens to the bell while some)
        self.woken_at = 0.0  # when the last wait returned (monotonic): the turn's claims came after
        self._drain_at_start: tuple[int, int] | None = None
        self._jobs: dict[str, tuple[str, int]] = {}  # running job id -> its folder's path, its watch
        self._job_at: dict[str, str] = {}  # a running job's folder's path -> its id
        self._to_follow: dict[str, tuple[float, str]] = {}  # job id -> when to watch its folder, which; by start

    def note_drain_at_start(self) -> None:
        """The drain request standing now is not for this manager (see the module's docstring)."""
        self._drain_at_start = self._drain_request(None)

    def open(self) -> None:
        """Start watching; inotify may be missing (the poll covers it), and the doorbell (then
        this manager watches `ready/` whoever leads)."""
        queue = self.queue
        self.watch = open_watch([queue.path, queue.serving.state_path(State.INCOMING)])
        if self.watch is not None:
            self.bell = Bell.open(queue.serving.bells_fd(), str(queue.path))
            if self.bell is None or self.bell.try_to_lead():
                self._watch_ready()
        for member in queue.serving.member_folders():
            self._watch_member(member)

    def _watch_ready(self) -> None:
        if self.watch is not None:
            try:
                self.watch.add(self.queue.serving.state_path(State.READY))
            except OSError as exc:  # the poll finds new jobs meanwhile
                log.error("cannot watch %s/ready: %s", self.queue.path, exc)
                return
            self.queue.serving.index.watching()  # it reports every new name from now on

    @property
    def listens(self) -> bool:
        """Whether the manager waits at the bell now: it does not lead, and has room for a job."""
        return self.bell is not None and not self.bell.leads and self.free > 0

    def answer(self) -> None:
        """The bell rang: take as many rings as the manager has room for, and rescan `ready/`."""
        if self.bell is not None and self.bell.answer(self.free):
            self.news.rung = True

    def after_claims(self, free: int, started_since: StartedSince) -> None:
        """At the end of a turn, with room for `free` more jobs of this queue: a leader without
        room rings for the new jobs it did not take this turn (`started_since`: the children of
        a queue started since a time); one that answered the bell and still has room found
        nothing, so the rings left are stale (they would wake managers for nothing)."""
        bell, found = self.bell, self.news
        self.free = free
        if bell is None:
            return
        if bell.leads:
            if found.ready and not free:
                bell.ring(len(found.ready) - started_since(self.index, self.woken_at))
        elif found.rung and free:
            bell.clear()

    def follow_job(self, job_id: str, folder: str, now: float) -> None:
        """Watch a running job's folder (`claimed/OWNER/ID`) for its `cancel` and `frozen` marks
        once it has run `FOLLOW_AFTER` seconds (`now`: its start, monotonic): an operator's
        cancel stops it (a pause freezes it) then, not at the manager's next heartbeat (which
        still looks: on NFS another host's mark makes no event here)."""
        if self.watch is not None:
            self._to_follow[job_id] = now + FOLLOW_AFTER, folder

    @property
    def next_follow(self) -> float:
        """When the next job's folder is to be watched (monotonic)."""
        for due, _ in self._to_follow.values():  # (the first: they were started in order)
            return due
        return float("inf")

    def follow_due(self, now: float) -> None:
        """Watch the folders of the jobs that have run long enough, and have each looked at
        once (as if marked): a mark made before its watch made no event."""
        if not self._to_follow or self.next_follow > now:
            return
        due = [job_id for job_id, (when, _) in self._to_follow.items() if when <= now]
        for job_id in due:
            self._follow(job_id, self._to_follow.pop(job_id)[1])
        self.news.marked = [*self.news.marked, *due]

    def _follow(self, job_id: str, folder: str) -> None:
        if self.watch is None:
            return
        try:
            wd = self.watch.add(folder, IN_CREATE | IN_MOVED_TO | IN_DELETE)
        except OSError:
            return  # (moved meanwhile: its end is near) the heartbeat looks for its mark
        self._jobs[job_id] = folder, wd
        self._job_at[folder] = job_id

    def forget_job(self, job_id: str) -> None:
        """Stop watching the folder of a job whose child ended (or never start)."""
        if self._to_follow.pop(job_id, None) is not None:
            return  # it ended before its folder was watched: the usual case
        found = self._jobs.pop(job_id, None)
        if found is not None and self.watch is not None:
            self._job_at.pop(found[0], None)
            self.watch.remove(found[1])

    def _watch_member(self, folder: Path) -> None:
        """Watch a member's submission folder too (what they submit lands there, not in
        incoming/ itself), up to `MEMBER_WATCHES`: past them, or where the folder cannot be
        watched, the poll finds their submissions."""
        if self.watch is None or self.watch.watched >= MEMBER_WATCHES:
            return
        try:
            self.watch.add(folder)
        except OSError:
            pass  # not a folder (a member's stray file), or no watch left: the poll covers it

    def read(self) -> None:
        """Take in what inotify saw since the last read."""
        if self.watch is None:
            return
        ready, incoming = self.queue.serving.state_path(State.READY), self.queue.serving.state_path(State.INCOMING)
        names: list[str] = []
        marked: list[str] = []
        found = self.news
        found.ready, found.marked = names, marked
        for folder, name in self.watch.read():
            if folder is None:
                found.missed = True
            elif folder == ready:
                names.append(name)
            elif isinstance(folder, str):  # a running job's folder (the only ones watched by a string)
                if name in (CANCEL_FILE, FREEZE_FILE) and folder in self._job_at:
                    marked.append(self._job_at[folder])
            elif folder == incoming:
                found.incoming = True
                self._watch_member(incoming / name)
            elif folder.parent == incoming:
                found.incoming = True
            elif name == DRAIN_FILE:
                found.drain = found.drain or self.drain_requested()
            elif name == PAUSE_FILE:
                found.pause = True

    def poll_if_due(self, now: float) -> None:
        """Make the news a poll when the poll interval is over, or events were lost."""
        found = self.news
        if now >= self.next_poll or found.missed:
            self.next_poll = now + self.poll_interval
            found.poll = found.incoming = True
            found.drain = found.drain or self.drain_requested()
            if self.bell is not None and not self.bell.leads and self.bell.try_to_lead():
                self._watch_ready()  # the leader went (its lock with it): this manager watches ready/ now
                found.missed = True  # and rescans it, for what arrived unseen

    def drain_requested(self) -> bool:
        """Whether a drain file stands that was not there (as it is now) at the start."""
        return self._drain_request(self._drain_at_start) != self._drain_at_start

    def _drain_request(self, unchanged: tuple[int, int] | None) -> tuple[int, int] | None:
        try:
            return self.queue.serving.drain_request()
        except OSError as exc:  # the queue folder turned unreadable: no request can be seen
            log.error("cannot look for a drain request in %s: %s", self.queue.path, exc)
            return unchanged

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        if self.bell is not None:
            self.bell.close()
            self.bell = None


class Wakeups:
    """The manager's wait: epoll over the signal pipe, each queue's watch and, while the
    manager has room for a job, each queue's doorbell (exclusive: a ring wakes one manager)."""

    def __init__(self, queues: Sequence[Queue], poll_interval: float, started_since: StartedSince) -> None:
        """`started_since(queue, time)`: how many children of the `queue`-th queue started since `time`."""
        self.watches = [QueueWatch(queue, poll_interval, index) for index, queue in enumerate(queues)]
        self._started_since = started_since
        self._signals: SignalPipe | None = None
        self._epoll: select.epoll | None = None
        self._watch_of: dict[int, QueueWatch] = {}  # an inotify descriptor -> its queue's watch
        self._listening: dict[int, QueueWatch] = {}  # a doorbell registered now -> its queue's watch
        self._found = Wakeup([watch.news for watch in self.watches])

    @property
    def next_poll(self) -> float:
        """When the wait must end at the latest: a queue's poll, or a job's folder to watch."""
        return min(min(watch.next_poll, watch.next_follow) for watch in self.watches)

    def open_signals(self) -> None:
        """First of all: from now on a SIGTERM is read here (a drain), not the default (death)."""
        for watch in self.watches:
            watch.note_drain_at_start()
        self._signals = SignalPipe()

    def open_watch(self) -> None:
        """Watch the queues once the manager is registered."""
        if self._signals is None:
            raise InternalError("open_signals() comes first")
        self._epoll = select.epoll()
        self._epoll.register(self._signals.read_fd, select.EPOLLIN)
        for watch in self.watches:
            watch.open()
            if watch.watch is not None:
                self._epoll.register(watch.watch.fd, select.EPOLLIN)
                self._watch_of[watch.watch.fd] = watch

    def follow_job(self, running: Running) -> None:
        """Watch a started job's folder for its `cancel` mark (see `QueueWatch.follow_job`)."""
        self.watches[running.queue].follow_job(running.claim.job_id, running.claim.place.path, running.started)

    def forget_job(self, running: Running) -> None:
        self.watches[running.queue].forget_job(running.claim.job_id)

    def after_claims(self, free: Sequence[int]) -> None:
        """The end of a turn: each queue's room for more jobs (`QueueWatch.after_claims`)."""
        for watch, room in zip(self.watches, free, strict=True):
            watch.after_claims(room, self._started_since)

    @property
    def fds(self) -> list[int]:
        """Descriptors a child must not keep: the wakeup pipe, epoll, inotify, the doorbells."""
        fds = [*self._signals.fds] if self._signals is not None else []
        fds += [self._epoll.fileno()] if self._epoll is not None else []
        fds += [watch.watch.fd for watch in self.watches if watch.watch is not None]
        return fds + [fd for watch in self.watches if watch.bell is not None for fd in watch.bell.fds]

    def wait(self, timeout: float) -> Wakeup:
        """Wait up to `timeout` seconds; say what happened."""
        if self._epoll is None or self._signals is None:
            raise InternalError("the manager waits only once started")
        self._listen(self._epoll)
        events = self._epoll.poll(timeout)
        found = self._found
        found.signals = ()
        now = time.monotonic()
        for watch in self.watches:
            watch.news.reset()
            watch.woken_at = now
        for fd, _ in events:
            if fd == self._signals.read_fd:  # (else skip the read: every turn counts, see PERFORMANCE.md)
                found.signals = self._signals.drain()
            elif fd in self._watch_of:
                self._watch_of[fd].read()
            elif fd in self._listening:
                self._listening[fd].answer()
        for watch in self.watches:
            watch.poll_if_due(now)
            watch.follow_due(now)
        return found

    def _listen(self, epoll: select.epoll) -> None:
        """Wait at each doorbell while the manager has room for its queue's jobs, not otherwise: a
        busy manager would be woken by rings it cannot answer, and take them from idle ones."""
        for watch in self.watches:
            bell = watch.bell
            if bell is None:
                continue
            if watch.listens and bell.fifo not in self._listening:
                epoll.register(bell.fifo, select.EPOLLIN | select.EPOLLEXCLUSIVE)
                self._listening[bell.fifo] = watch
            elif not watch.listens and bell.fifo in self._listening:
                epoll.unregister(bell.fifo)
                del self._listening[bell.fifo]

    def close(self) -> None:
        """Close epoll and the watches, and give the process its signal handlers back."""
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
        self._watch_of.clear()
        self._listening.clear()
        for watch in self.watches:
            watch.close()
        if self._signals is not None:
            self._signals.close()
            self._signals = None
