"""Backoff between attempts, expressed as tenacity wait strategies.

A registered function may bring any tenacity wait (`wait_fixed(5)`,
`wait_exponential(...)`, `wait_chain(...)`); we only ask it for the delay
after a given number of attempts, so the strategy runs outside tenacity's
retry loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tenacity

WaitStrategy = Callable[[tenacity.RetryCallState], float] | Any

DEFAULT_WAIT: WaitStrategy = tenacity.wait_exponential_jitter(initial=1, max=300, exp_base=2, jitter=1)
"""Exponential from 1 s, doubling, plus up to 1 s of jitter, capped at 5 minutes."""


def retry_delay(wait: WaitStrategy, attempts: int) -> float:
    """Seconds to wait before the next attempt, after `attempts` attempts have failed."""
    state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]  # wait strategies never touch the retry object
    state.attempt_number = max(1, attempts)
    delay = float(wait(state))
    return max(0.0, delay)
