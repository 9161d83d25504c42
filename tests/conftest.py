"""What every test folder shares: where the repository is, manager settings small
enough for tests (as `Manager` settings and as `forkvisor run` options, from one
table), `wait_until`, the one way a test waits (poll a condition with a deadline),
and the fixtures of the process and fault tests (defined in tests/processes.py and
tests/faults/conftest.py, made available to every folder here)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from supervisor import Manager

REPO = Path(__file__).resolve().parent.parent

FAST: dict[str, Any] = {
    "concurrency": 2,
    "lease": 3.0,
    "sweep_interval": 0.5,
    "kill_grace": 0.5,
    "poll_interval": 0.2,
    "memory_poll": 0.1,
    "drain_timeout": 5.0,
}
"""Manager settings small enough for tests; a test overrides what it needs."""

FAST_CLI = [
    word
    for name, value in FAST.items()
    if name != "memory_poll"  # not an option of `forkvisor run`
    for word in (f"--{name.replace('_', '-')}", f"{value:g}")
]
"""The same settings as `forkvisor run` options; later options override earlier ones."""


def wait_until(
    condition: Callable[[], object],
    timeout: float = 5.0,
    what: str = "the condition held",
    *,
    manager: Manager | None = None,
) -> None:
    """Poll `condition` until it is true; fail naming `what` after `timeout` seconds.

    With `manager`, each pause is a `manager.step(timeout=...)`, so the manager
    keeps working (and wakes at once on a child's exit or a new job) while we wait.
    """
    deadline = time.monotonic() + timeout
    pause = 0.0005
    while not condition():
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"timed out after {timeout:g}s waiting until {what}")
        if manager is not None:
            manager.step(timeout=min(pause, left))
        else:
            time.sleep(min(pause, left))  # the backoff of a bounded poll, not a synchronisation
        pause = min(pause * 2, 0.05)


# The shared fixtures, for every folder (imported last: they use the names above).
from tests.faults.conftest import nobody, open_dir, outside, tmpfs  # noqa: E402
from tests.processes import barriers, procs, queue  # noqa: E402

__all__ = [
    "FAST",
    "FAST_CLI",
    "REPO",
    "barriers",
    "nobody",
    "open_dir",
    "outside",
    "procs",
    "queue",
    "tmpfs",
    "wait_until",
]
