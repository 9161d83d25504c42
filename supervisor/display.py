"""What a manager shows of itself: its title in `ps`, its status for systemd (when systemd
asked for it: `Type=notify`), and the status line SIGUSR1 logs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from supervisor.notify import Notifier
from supervisor.running import Running
from supervisor.served import Served
from supervisor.titles import ManagerTitle


class Display:
    """The manager's title and status, from what it tells this part at each turn."""

    def __init__(self, served: Sequence[Served], concurrency: int) -> None:
        self.served = served
        self.concurrency = concurrency
        self.notifier = Notifier()  # systemd's Type=notify, when it asked
        self.title = ManagerTitle(" ".join(str(each.queue.path) for each in served), concurrency)

    def line(self, running: Mapping[int, Running], phase: str) -> str:
        """One line: how busy, the manager's phase, and which job each child runs."""
        jobs = ", ".join(f"{each.claim.job_id} pid {each.pid}" for each in running.values()) or "none"
        return f"{len(running)}/{self.concurrency} busy, {phase}, running: {jobs}"

    def refresh(self, busy: int, draining: bool, now: float | None = None) -> None:
        """The title in `ps` (the busy count at most once a second unless `now` is None); the
        status systemd shows follows it."""
        state = " draining" if draining else " paused" if any(each.paused for each in self.served) else ""
        if self.title.show(busy, state, now):
            self.notifier.status_changed(lambda: self.text(busy, draining))

    def ready(self, busy: int, draining: bool) -> None:
        """The manager serves: show it, and tell systemd."""
        self.refresh(busy, draining)
        self.notifier.ready(self.text(busy, draining))

    def stopping(self, busy: int, draining: bool) -> None:
        """The manager drains: show it, and tell systemd."""
        self.refresh(busy, draining)
        self.notifier.stopping(self.text(busy, draining))

    def next_deadline(self) -> float:
        """When systemd's watchdog wants to hear from the manager next (never, if it does not)."""
        return self.notifier.next_deadline() if self.notifier.enabled else float("inf")

    def text(self, busy: int, draining: bool) -> str:
        """What `systemctl status` shows: how busy, and each queue's counts."""
        shown = f"{busy}/{self.concurrency} busy{', draining' if draining else ''}"
        if len(self.served) == 1:
            return f"{shown}; {self.served[0].counts_text()}"
        return shown + "".join(f"; {each.queue.path.name}: {each.counts_text()}" for each in self.served)
