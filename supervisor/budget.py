"""A manager's budget (`--max-jobs`, `--max-runtime`): for batch allocations and
recycled workers, a manager that exits cleanly once it has started so many jobs or
served so long. Spent, the manager drains (running jobs finish, or go back after
`--drain-timeout` without using an attempt) and exits 0; the rest of the queue is
left as it is, for the next manager."""

from __future__ import annotations


class Budget:
    """How many jobs a manager may still start, and until when it serves (monotonic)."""

    def __init__(self, max_jobs: int | None, max_runtime: float | None) -> None:
        self.jobs_left = max_jobs
        self.max_runtime = max_runtime
        self.limited = max_jobs is not None or max_runtime is not None
        self.ends_at = float("inf")

    def start(self, now: float) -> None:
        if self.max_runtime is not None:
            self.ends_at = now + self.max_runtime

    def allows_another(self) -> bool:
        return self.jobs_left is None or self.jobs_left > 0

    def started_one(self) -> None:
        if self.jobs_left is not None:
            self.jobs_left -= 1

    def spent(self, now: float) -> str | None:
        """Why the budget is spent, or None."""
        if not self.allows_another():
            return "--max-jobs reached"
        if now >= self.ends_at:
            return f"--max-runtime of {self.max_runtime:g}s reached"
        return None
