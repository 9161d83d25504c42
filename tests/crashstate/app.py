"""The functions the crash-state workloads run (`--app tests.crashstate.app:registry`)."""

from __future__ import annotations

import os
import time

from jobs import CannotComplete, Registry, current

registry = Registry()
RECOVERING = "FVTEST_RECOVERING"  # set by `check.tool`: no job of these waits


@registry.job(name="crash.add")
def add(a: int, b: int) -> int:
    return a + b


@registry.job(name="crash.flaky", max_attempts=3, backoff="none")
def flaky() -> str:
    """Fails its first attempt, succeeds at its second: a retry."""
    if current().attempt == 1:
        raise RuntimeError("first attempt fails")
    return "second attempt"


@registry.job(name="crash.broken", max_attempts=2, backoff="none")
def broken() -> None:
    """Fails every attempt: buried once they are used."""
    raise RuntimeError("always fails")


@registry.job(name="crash.refuse")
def refuse() -> None:
    raise CannotComplete("never")


@registry.job(name="crash.sleeper", max_attempts=5, backoff="none")
def sleeper() -> str:
    """Blocks in its first run (a test kills or drains its manager meanwhile); returns in the
    next, and whenever the crash-state checker recovers a queue (RECOVERING is set)."""
    if current().run_path.name == "attempt-1" and not os.environ.get(RECOVERING):
        time.sleep(120)
    return "woke"
