"""How a manager runs: every field, its default and its check, in one place.

The CLI builds its options from these fields (`forkvisor run --help` shows the
defaults); a queue's own settings (`queue.json`: lease, retention) apply where
the manager is not told otherwise (see `jobs.config`), each queue its own when a
manager serves several (`for_queue`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from jobs import QUEUE_DEFAULTS, TMP_AGE, Queue
from supervisor.containment import MODES
from supervisor.errors import ConfigError


@dataclass(frozen=True)
class Settings:
    """How a manager runs; every field has a sensible default."""

    concurrency: int = os.cpu_count() or 2
    lease: float = QUEUE_DEFAULTS["lease"]  # an owner silent this long loses its claims (the queue's, unless told)
    sweep_interval: float = 0.0  # 0: a sixth of the lease, at most 5 s
    drain_timeout: float = 60.0  # how long running jobs may finish after a drain request
    kill_grace: float = 5.0  # between SIGTERM and SIGKILL
    poll_interval: float = 1.0  # safety-net rescan (NFS, missed events)
    memory_poll: float = 0.5
    horizon: float = 300.0  # --burst leaves jobs scheduled further ahead than this
    tmp_age: float = TMP_AGE  # a tmp/ entry older than this was abandoned
    retention: float | None = QUEUE_DEFAULTS["retention"]  # purge done jobs older than this (the queue's)
    commands: bool = True  # run command jobs (see `jobs.command`)
    stall_timeout: float = 60.0  # --burst gives up when the store has failed this long without a success
    max_jobs: int | None = None  # drain and exit 0 once this many jobs were started
    max_runtime: float | None = None  # drain and exit 0 after serving this long
    run_as_submitter: bool = False  # as root: run each job as the member who submitted it (privileges.py)
    pass_env: tuple[str, ...] = ()  # with run_as_submitter: the manager's variables its jobs get too
    members_as_root: bool = False  # as root, on a shared queue without run_as_submitter: said on purpose
    containment: str = "auto"  # how a run's processes are kept together: auto, cgroup, processes (containment.py)

    def __post_init__(self) -> None:
        if not self.sweep_interval:
            object.__setattr__(self, "sweep_interval", min(5.0, self.lease / 6))
        if self.max_jobs is not None and self.max_jobs < 1:
            raise ConfigError(f"max_jobs must be at least 1, got {self.max_jobs}")
        if self.max_runtime is not None and self.max_runtime <= 0:
            raise ConfigError(f"max_runtime must be greater than 0, got {self.max_runtime}")
        if self.containment not in MODES:
            raise ConfigError(f"containment is one of {', '.join(MODES)}, got {self.containment!r}")
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {self.concurrency}")
        for name in ("lease", "sweep_interval", "kill_grace", "poll_interval", "memory_poll", "stall_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be greater than 0, got {getattr(self, name)}")
        if self.sweep_interval >= self.lease:
            raise ConfigError(f"sweep_interval ({self.sweep_interval}s) must be shorter than the lease ({self.lease}s)")


def default(name: str) -> object:
    """A field's default, for the CLI's help (the CLI passes only the options it was given)."""
    return Settings.__dataclass_fields__[name].default


def for_queue(queue: Queue, given: Mapping[str, object]) -> Settings:
    """How a manager serves `queue`: what it was `given`, else the queue's own lease and
    retention, and command jobs on for a private queue, off for a shared one (a command
    job runs anything its manager's user may: on a shared queue, only as its submitter)."""
    stored = queue.settings
    fields = {"lease": stored["lease"], "retention": stored["retention"], **given}
    fields.setdefault("commands", not queue.shared or bool(given.get("run_as_submitter")))
    try:
        return Settings(**fields)  # checked by Settings itself
    except ConfigError as exc:  # the queue's lease may not fit what was given
        raise ConfigError(f"serving {queue.path}: {exc}") from None
