"""A job's child as the manager tracks it: its life (`Life`, and the steps between), and
why the manager stopped it (`Stop`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import psutil

from jobs import Claim
from supervisor.containment import CgroupRun
from supervisor.errors import InternalError


class Stop(Enum):
    """Why the manager stopped a job's child; the value is `outcome.json`'s `limit`."""

    TIMEOUT = "timeout"  # it ran past its timeout: the attempt failed
    MEMORY = "memory"  # it used more than its memory limit: the attempt failed
    OUTPUT = "output"  # its output could not be bounded as it ran and went past its ceiling: failed
    CANCELLED = "cancelled"  # an operator cancelled it: dead, no further attempt
    DRAIN = "drain"  # the manager drains or stops: released, the attempt not counted


class Life(Enum):
    """Where a job's child is in its life, as its manager acts on it (until it is reaped)."""

    RUNNING = "running"
    FROZEN = "frozen"  # an operator froze its run: every process stopped, its timeout standing still
    STOPPING = "stopping"  # sent SIGTERM (why: `Running.stopped`); SIGKILL at `Running.kill_at`
    KILLED = "killed"  # sent SIGKILL: only its end is awaited
    LOST = "lost"  # its claim was taken back: SIGKILLed, its end recorded nowhere


# The steps a child's life may take; any other is a bug of the manager's, raised as one.
LIFE_STEPS: dict[Life, frozenset[Life]] = {
    Life.RUNNING: frozenset({Life.FROZEN, Life.STOPPING, Life.KILLED, Life.LOST}),
    Life.FROZEN: frozenset({Life.RUNNING, Life.KILLED, Life.LOST}),  # (stopped once thawed)
    Life.STOPPING: frozenset({Life.KILLED, Life.LOST}),
    Life.KILLED: frozenset({Life.LOST}),
    Life.LOST: frozenset(),
}
UNSTOPPED = frozenset({Life.RUNNING, Life.FROZEN})  # not yet stopped, killed or lost by its manager


@dataclass
class Running:
    """One job's child: started by this manager, not yet reaped."""

    pid: int
    claim: Claim
    started: float  # monotonic
    started_wall: float
    queue: int = 0  # which of its manager's queues the job came from (an index in the order served)
    life: Life = Life.RUNNING  # changed by the steps below only
    stopped: Stop | None = None  # why its run ends as it does: set when stopped, or found at its end
    kill_at: float | None = None  # (STOPPING) when SIGKILL follows the SIGTERM already sent
    frozen_since: float | None = None  # (FROZEN) monotonic: when an operator froze it
    frozen_for: float = 0.0  # seconds it spent frozen before (its timeout does not run meanwhile)
    descendants: list[psutil.Process] = field(default_factory=list)  # (where runs have no cgroup)
    strays: list[int] = field(default_factory=list)  # (processes mode) our adopted children of its run, last look
    box: CgroupRun | None = None  # its run's cgroup, where runs have one
    output_unbounded: bool = False  # its output could not be bounded as it ran (said once)
    cost: dict[str, Any] | None = None  # what its cgroup counted, read at its end (`CgroupRun.cost`)
    shut_out: bool = False  # its gate was shut: no code of its job ran, and its run has no folder

    @property
    def released(self) -> bool:
        """Stopped by a drain or shutdown: goes back without using an attempt."""
        return self.stopped is Stop.DRAIN

    @property
    def frozen(self) -> bool:
        return self.life is Life.FROZEN

    @property
    def lost(self) -> bool:
        return self.life is Life.LOST

    def freeze(self, now: float) -> None:
        self._step(Life.FROZEN)
        self.frozen_since = now

    def thaw(self, now: float) -> None:
        self._step(Life.RUNNING)
        self.frozen_for += now - (self.frozen_since or now)
        self.frozen_since = None

    def stop(self, why: Stop, kill_at: float) -> None:
        self._step(Life.STOPPING)
        self.stopped, self.kill_at = why, kill_at

    def kill(self, why: Stop | None = None) -> None:
        """SIGKILL sent (past its grace, or at once with `why`, as a second SIGTERM does)."""
        self._step(Life.KILLED)
        self.stopped, self.kill_at = self.stopped or why, None

    def lose(self) -> None:
        self._step(Life.LOST)
        self.kill_at = None

    def _step(self, to: Life) -> None:
        if to not in LIFE_STEPS[self.life]:
            raise InternalError(
                f"job {self.claim.job_id} pid {self.pid}: its child cannot go from {self.life.value} to {to.value}"
            )
        self.life = to
