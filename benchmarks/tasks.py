"""The benchmarks' job functions, registered under explicit names.

A manager loads them with `--app benchmarks.tasks:registry` (run from the
repository root, which `forkvisor run` puts on the import path).
"""

from __future__ import annotations

import time

from jobs import Registry

registry = Registry()


@registry.job(name="bench.noop")
def noop() -> None:
    """Do nothing: what is measured is everything around the job."""


@registry.job(name="bench.stamp")
def stamp() -> float:
    """Return when the job's function started, on CLOCK_MONOTONIC (system-wide)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)
