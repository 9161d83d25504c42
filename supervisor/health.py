"""Whether the store works: a `--burst` manager gives up on a queue where every change
has failed for `stall_timeout` seconds (a full disk, a lost mount), instead of waiting
for ever; a serving manager only logs, and carries on once the store works again."""

from __future__ import annotations

import time


class StoreHealth:
    """Since when every change to the queue has failed, and the last failure."""

    def __init__(self) -> None:
        self.failing_since: float | None = None  # monotonic; None while changes succeed
        self.last_failure = ""

    def worked(self) -> None:
        """A job moved forward (claimed, or its outcome recorded)."""
        self.failing_since = None

    def failed(self, exc: BaseException) -> None:
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        self.last_failure = str(exc)

    def stalled(self, timeout: float) -> bool:
        since = self.failing_since
        return since is not None and time.monotonic() - since >= timeout
