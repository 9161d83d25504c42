"""An app (`--app tests.periodic_app:registry`) that declares a schedule in Python, for
the tests of periodic jobs (kept apart from `sample_jobs`, whose managers must fire nothing)."""

from __future__ import annotations

import jobs

registry = jobs.Registry()


@registry.periodic("every 1s", name="heartbeat", missed="skip")
def heartbeat() -> str:
    return "beat"


@registry.job
def plain(n: int) -> int:
    return n
