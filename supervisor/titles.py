"""What a forkvisor process is called: a long title that `ps -f` shows (role, queue,
how busy, which job), and a short kernel name without spaces that says its role.

The kernel's name (`/proc/PID/comm`, 15 bytes) is what `ps -e`, `pgrep`, `top`,
monitoring agents and Slurm's process tracking read. `setproctitle` sets it to the
first 15 bytes of the title ("forkvisor: mana"), and Slurm parses `/proc/PID/stat`
in a way that skips any process whose name holds a space: such a manager never gets
the SIGTERM of a `scancel`. So each title is followed by the short name of its role.
"""

from __future__ import annotations

import ctypes
import enum
import time

from setproctitle import getproctitle, setproctitle

_PR_SET_NAME = 15
_libc = ctypes.CDLL(None, use_errno=True)


class Role(enum.Enum):
    """The short name of each kind of forkvisor process (at most 15 bytes, no space)."""

    MANAGER = "fv-manager"
    SWEEPER = "fv-sweeper"
    JOB = "fv-job"  # a Python job's child; a command job takes its program's name when it execs


_NAMES = {role: role.value.encode() for role in Role}


def prepare() -> None:
    """Let setproctitle find the memory it writes titles into (the end of argv and of the
    environment) before anything changes the environment: once a variable is removed, it
    finds none, and every later title is silently lost (`ps`, `pgrep`, Slurm see nothing)."""
    getproctitle()


def set_title(role: Role, title: str) -> None:
    """Show `title` in `ps -f` and `role`'s short name in `/proc/PID/comm`."""
    setproctitle(title)
    _libc.prctl(_PR_SET_NAME, _NAMES[role], 0, 0, 0)


class ManagerTitle:
    """How busy the manager is, in `ps`. A change of state (draining, paused) shows at once;
    the busy count at most once every `EVERY` seconds: setting a title writes a page the
    jobs' children share (a copy-on-write fault each time, see docs/PERFORMANCE.md)."""

    EVERY = 1.0

    def __init__(self, queues: str, concurrency: int) -> None:
        self._prefix = f"forkvisor: manager {queues}"
        self._concurrency = concurrency
        self._title = ""
        self._state = ""
        self._next = 0.0

    def show(self, busy: int, state: str, now: float | None) -> bool:
        """Show `busy` and `state` (" draining", " paused" or ""); `now` None: at once.
        Whether the title changed."""
        if state == self._state and now is not None and now < self._next:
            return False
        title = f"{self._prefix} {busy}/{self._concurrency} busy{state}"
        if title == self._title:
            return False
        set_title(Role.MANAGER, title)
        self._title, self._state = title, state
        self._next = (time.monotonic() if now is None else now) + self.EVERY
        return True
