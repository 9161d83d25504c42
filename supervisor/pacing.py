"""Back-off after a failure: of a fork (the host is out of processes or memory) or of
the sweeper (a crash loop). Each failure doubles the wait, up to a cap; a success
(or, for the sweeper, a healthy run) starts again from the shortest wait."""

from __future__ import annotations


class Backoff:
    """When the next try may come, after failures; times are monotonic seconds."""

    def __init__(self, shortest: float, longest: float) -> None:
        self.shortest, self.longest = shortest, longest
        self.wait = shortest  # how long the next failure makes us wait
        self.next_try = 0.0

    def due(self, now: float) -> bool:
        return now >= self.next_try

    def failed(self, now: float) -> float:
        """Note a failure at `now`; return how long to wait before the next try."""
        waited = self.wait
        self.next_try = now + waited
        self.wait = min(waited * 2, self.longest)
        return waited

    def succeeded(self) -> None:
        self.wait = self.shortest
