"""A job's child as the manager tracks it, and why the manager stopped it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import psutil

from jobs import Claim
from supervisor.containment import CgroupRun


class Stop(Enum):
    """Why the manager stopped a job's child; the value is `outcome.json`'s `limit`."""

    TIMEOUT = "timeout"  # it ran past its timeout: the attempt failed
    MEMORY = "memory"  # it used more than its memory limit: the attempt failed
    CANCELLED = "cancelled"  # an operator cancelled it: dead, no further attempt
    DRAIN = "drain"  # the manager drains or stops: released, the attempt not counted


@dataclass
class Running:
    """One job's child: started by this manager, not yet reaped."""

    pid: int
    claim: Claim
    started: float  # monotonic
    started_wall: float
    queue: int = 0  # which of its manager's queues the job came from (an index in the order served)
    stopped: Stop | None = None  # set once the manager sends it SIGTERM (or SIGKILL)
    kill_at: float | None = None  # when SIGKILL follows the SIGTERM already sent
    lost: bool = False  # its claim was taken back: its end is recorded nowhere
    descendants: list[psutil.Process] = field(default_factory=list)  # (where runs have no cgroup)
    box: CgroupRun | None = None  # its run's cgroup, where runs have one

    @property
    def released(self) -> bool:
        """Stopped by a drain or shutdown: goes back without using an attempt."""
        return self.stopped is Stop.DRAIN
