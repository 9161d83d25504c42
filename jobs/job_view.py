"""What a reader saw of one job: `Job`, a read-only view of its folder at the moment it
was read, and each of its `Run`s (`view.read_job` makes them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.job import JobSpec, State, created_at
from jobs.policy import Policy


@dataclass(frozen=True)
class Run:
    """One run of a job: its folder and, once harvested, its outcome."""

    number: int
    path: Path
    outcome: Mapping[str, Any] | None

    @property
    def counted(self) -> bool:
        """False for a run stopped by an operator's shutdown (it used no attempt)."""
        return not (self.outcome or {}).get("released", False)


@dataclass(frozen=True)
class Job:
    """A read-only view of one job directory at the moment it was read."""

    id: str
    state: State
    path: Path
    spec: JobSpec
    attempts: int
    history: tuple[Run, ...]
    result: Any = None
    error: Mapping[str, Any] | None = None
    owner: str | None = None
    policy: Policy | None = None  # what its newest run was started under (attempt-N/policy.json)
    frozen: bool = False  # its newest run is frozen by an operator (`Queue.freeze`), as its folder says

    @property
    def function(self) -> str:
        return self.spec.function

    @property
    def created(self) -> float:
        """When it was enqueued (epoch seconds): its spec says, else its id does."""
        return self.spec.created or created_at(self.id)
