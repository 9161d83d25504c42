"""Fixtures of the security suite: the fault suite's (the outside world, other users, a
small file system) and the process fixtures, shared here by import."""

from __future__ import annotations

from tests.faults.conftest import nobody, open_dir, outside, tmpfs
from tests.supervisor.conftest import barriers, procs, queue

__all__ = ["barriers", "nobody", "open_dir", "outside", "procs", "queue", "tmpfs"]
