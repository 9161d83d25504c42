"""Backoff between attempts: as data (`Backoff`), or any tenacity wait strategy.

A job file, `queue.json` and the command line can only hold data, so a
backoff there is text: `fixed 30s` (or just `30s`), or `exponential 1s 5m`
(from 1 s, doubling, capped at 5 minutes, plus up to the first delay of random
jitter). A registered function may also bring any tenacity wait
(`wait_fixed(5)`, `wait_chain(...)`); we only ask a strategy for the delay
after a given number of attempts, so it runs outside tenacity's retry loop.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tenacity

from jobs.errors import InvalidJob
from jobs.units import format_duration, parse_duration

WaitStrategy = Callable[[tenacity.RetryCallState], float] | Any


@dataclass(frozen=True)
class Backoff:
    """Seconds between attempts: `first` every time (fixed), or from `first` doubling up to `cap`."""

    first: float
    cap: float | None = None  # None: fixed

    def __post_init__(self) -> None:
        if self.cap is not None and self.cap < self.first:
            raise InvalidJob(f"backoff {self}: the cap must not be shorter than the first delay")

    @classmethod
    def parse(cls, text: str) -> Backoff:
        """`fixed 30s`, `30s`, `exponential 1s 5m` or `none` (retry at once); raise InvalidJob."""
        words = text.split() if isinstance(text, str) else []
        if len(words) == 1 and words[0].lower() in ("none", "0"):
            return cls(0.0)
        if len(words) == 1 and not words[0][:1].isdigit():
            words = []  # not a duration at all: say what a backoff looks like
        try:
            if len(words) == 1:
                return cls(parse_duration(words[0]))
            if len(words) == 2 and words[0] == "fixed":
                return cls(parse_duration(words[1]))
            if len(words) == 3 and words[0] == "exponential":
                return cls(parse_duration(words[1]), parse_duration(words[2]))
        except ValueError as exc:
            raise InvalidJob(f"backoff {text!r}: {exc}") from None
        raise InvalidJob(f"backoff {text!r} is not one: write `fixed 30s`, `30s` or `exponential 1s 5m`")

    def __str__(self) -> str:
        if self.cap is None:
            return f"fixed {format_duration(self.first)}"
        return f"exponential {format_duration(self.first)} {format_duration(self.cap)}"

    def __call__(self, state: tenacity.RetryCallState) -> float:
        """The delay before the next attempt, as a tenacity wait strategy: what tenacity's
        `wait_fixed(first)` and `wait_exponential_jitter(first, cap, jitter=first)` give."""
        if self.cap is None:
            return self.first
        exponent = min(max(0, state.attempt_number - 1), 64)  # 2**64 s is past any cap
        return max(0.0, min(self.first * 2.0**exponent + random.uniform(0, self.first), self.cap))


@dataclass(frozen=True)
class Described:
    """A backoff known only by how it reads (a custom strategy a manager advertised or
    recorded): it waits as its text says when that is data, else as the built-in one."""

    text: str

    def __call__(self, state: tenacity.RetryCallState) -> float:
        try:
            return Backoff.parse(self.text)(state)
        except InvalidJob:
            return DEFAULT_BACKOFF(state)


DEFAULT_BACKOFF = Backoff(1.0, 300.0)
"""Exponential from 1 s, doubling, plus up to 1 s of jitter, capped at 5 minutes."""


def as_backoff(value: object, name: str = "backoff") -> WaitStrategy:
    """A backoff given as text, a `Backoff`, or (from Python) any tenacity wait strategy."""
    if isinstance(value, str):
        return Backoff.parse(value)
    if callable(value):
        return value
    raise InvalidJob(f"{name} must be text such as `exponential 1s 5m` or a tenacity wait, got {value!r:.60}")


def describe(wait: WaitStrategy) -> str:
    """How a strategy reads in `show` and in a job's `policy.json`."""
    if isinstance(wait, Backoff):
        return str(wait)
    if isinstance(wait, Described):
        return wait.text
    if isinstance(wait, tenacity.wait_fixed):
        return str(Backoff(float(wait.wait_fixed)))
    if isinstance(wait, tenacity.wait_exponential_jitter):
        first = getattr(wait, "multiplier", getattr(wait, "initial", None))  # tenacity 9 renamed it
        if first and wait.jitter == first and wait.exp_base == 2 and wait.max >= first:
            return str(Backoff(float(first), float(wait.max)))
    return f"custom ({type(wait).__name__})"


def retry_delay(wait: WaitStrategy, attempts: int) -> float:
    """Seconds to wait before the next attempt, after `attempts` attempts have failed."""
    state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]  # wait strategies never touch the retry object
    state.attempt_number = max(1, attempts)
    delay = float(wait(state))
    return max(0.0, delay)
