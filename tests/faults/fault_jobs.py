"""Callables the fault tests need beyond `tests.sample_jobs`, in their own registry.

A manager loads them with `--app tests.faults.fault_jobs:registry` (run from the
repository root), or in this process through `start_manager`. They use the
same barriers as the sample jobs: announce in a `ready` file, then wait for a
`release` file the test creates, both outside the queue.
"""

from __future__ import annotations

import os
import time
from typing import NoReturn

from jobs import CannotComplete, Registry
from tests.sample_jobs import announce, wait_for_file

registry = Registry()

CHUNK = 16 * 1024


@registry.job(name="fault.now")
def now() -> float:
    """The child's clock (under libfaketime: the faked one)."""
    return time.time()


@registry.job(name="fault.ok")
def ok(value: object = None) -> object:
    return value


@registry.job(name="fault.flood", max_attempts=1)
def flood(ready: str) -> NoReturn:
    """Write to stdout (the attempt folder) until the disk is full, then fail with that error."""
    announce(ready)
    while True:
        os.write(1, b"x" * CHUNK)  # raises OSError(ENOSPC) once the file system is full


@registry.job(name="fault.cannot_after_release")
def cannot_after_release(ready: str, release: str) -> NoReturn:
    """Announce, wait for `release`, then say the job can never succeed."""
    announce(ready)
    wait_for_file(release)
    raise CannotComplete("the input is bad")


@registry.job(name="fault.detached_release", max_attempts=3)
def detached_release(ready: str, release: str) -> str:
    """Point stdout and stderr away from the queue (so that nothing in it is open for
    writing and its file system can be remounted read-only), announce, wait for `release`."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    announce(ready)
    wait_for_file(release)
    return "released"
