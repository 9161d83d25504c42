"""The functions the crash-state workloads run (`--app tests.crashstate.app:registry`)."""

from __future__ import annotations

from jobs import CannotComplete, Registry, current

registry = Registry()


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
