"""systemd's notify protocol (sd_notify(3)) for `Type=notify` units, without a dependency.

Each message is one datagram of `KEY=value` lines to the AF_UNIX socket that
`$NOTIFY_SOCKET` names (a path, or `@name` in the abstract namespace). The manager
sends `READY=1` once it serves, `STATUS=` (busy/concurrency and the queue's counts)
at most once a second when it changed, `STOPPING=1` when it drains, and
`WATCHDOG=1` every half of `$WATCHDOG_USEC` when the unit sets `WatchdogSec=`: a
manager whose loop stops turning is then restarted by systemd.

The variables are taken out of the environment as they are read, so that no job
(which inherits the manager's environment) can speak for the manager. Without
`$NOTIFY_SOCKET` every call does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, MutableMapping

log = logging.getLogger(__name__)
STATUS_EVERY = 1.0  # seconds between two STATUS= updates at most


class Notifier:
    """Tells systemd how the manager is doing, if systemd asked (`$NOTIFY_SOCKET`)."""

    def __init__(self, environ: MutableMapping[str, str] = os.environ) -> None:
        address = environ.pop("NOTIFY_SOCKET", "")
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.enabled = bool(self.address)
        self.watchdog = _watchdog_interval(environ.pop("WATCHDOG_USEC", ""), environ.pop("WATCHDOG_PID", ""))
        self.next_ping = 0.0 if self.watchdog else float("inf")
        self._status: Callable[[], str] | None = None  # how to say it, once it may have changed
        self._next_status = 0.0
        self._failed = False

    def ready(self, status: str) -> None:
        self._send(f"READY=1\nMAINPID={os.getpid()}\nSTATUS={status}")

    def stopping(self, status: str) -> None:
        self._send(f"STOPPING=1\nSTATUS={status}")

    def status_changed(self, status: Callable[[], str]) -> None:
        """The status may have changed; `status` says it (called only when it is sent)."""
        if self.enabled:
            self._status = status

    def tick(self, now: float) -> None:
        """Send what is due: the watchdog's ping, a changed status (monotonic `now`)."""
        if now >= self.next_ping:
            self._send("WATCHDOG=1")
            self.next_ping = now + self.watchdog / 2
        if self._status is not None and now >= self._next_status:
            self._send(f"STATUS={self._status()}")
            self._status, self._next_status = None, now + STATUS_EVERY

    def next_deadline(self) -> float:
        return min(self.next_ping, self._next_status if self._status is not None else float("inf"))

    def _send(self, message: str) -> None:
        if not self.address:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message.encode(), self.address)
        except OSError as exc:  # systemd restarted, or the socket is gone: say so once, carry on
            if not self._failed:
                log.warning("cannot notify systemd at %s: %s", self.address.replace("\0", "@"), exc)
            self._failed = True


def _watchdog_interval(usec: str, pid: str) -> float:
    """The watchdog's interval in seconds, 0 without one (or when it is meant for another process)."""
    if pid and pid != str(os.getpid()):
        return 0.0
    try:
        return max(0, int(usec)) / 1e6
    except ValueError:
        return 0.0
