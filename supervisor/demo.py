"""The jobs `forkvisor demo` runs: a few real callables with the behaviours a
queue must handle (success, a flaky failure, slowness, a crash, a job that
can never succeed)."""

from __future__ import annotations

import hashlib
import os
import random
import time

import tenacity

from jobs import CannotComplete, Registry

registry = Registry()


@registry.job(name="demo.checksum")
def checksum(text: str, rounds: int = 1000) -> str:
    """Hash a text many times: a little real CPU work."""
    digest = text.encode()
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:16]


@registry.job(name="demo.flaky", max_attempts=6, backoff=tenacity.wait_fixed(0.2))
def flaky(chance: float = 0.5) -> str:
    """Fail at random, as a job talking to an unreliable service would."""
    if random.random() < chance:
        raise ConnectionError("the service did not answer (simulated)")
    return "got an answer"


@registry.job(name="demo.slow")
def slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@registry.job(name="demo.crash", max_attempts=2, backoff=tenacity.wait_fixed(0.2))
def crash(code: int = 3) -> None:
    """Exit without cleaning up, as a job hit by a fatal error in C code would."""
    os._exit(code)


@registry.job(name="demo.validate")
def validate(value: object) -> object:
    """Refuse bad input for good: no retry can fix it."""
    if not isinstance(value, int):
        raise CannotComplete(f"expected an integer, got {value!r}")
    return value * 2
