"""A job's child as the manager tracks it, and why the manager stopped it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

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
    output_unbounded: bool = False  # its output could not be bounded as it ran (said once)
    frozen_since: float | None = None  # monotonic: when an operator froze it (None: it runs)
    frozen_for: float = 0.0  # seconds it spent frozen before (its timeout does not run meanwhile)
    cost: dict[str, Any] | None = None  # what its cgroup counted, read at its end (`CgroupRun.cost`)

    @property
    def released(self) -> bool:
        """Stopped by a drain or shutdown: goes back without using an attempt."""
        return self.stopped is Stop.DRAIN
