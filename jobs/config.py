"""A queue's settings, kept in `queue.json` under "defaults".

    max_attempts  attempts a job gets unless it or its function says otherwise (3)
    timeout       seconds a job may run unless it or its function says otherwise (none)
    memory_limit  bytes of RSS a job may use unless it or its function says otherwise (none)
    output_limit  bytes of stdout, and of stderr, a run keeps: the head and the tail (8M)
    backoff       delay between attempts unless the job or its function says otherwise
                  (exponential 1s 5m)
    lease         seconds a silent manager keeps its claims (30)
    retention     done jobs older than this many seconds are purged by sweeps (none: kept)
    root_jobs     with --run-as-submitter, a job may run as root (uid 0): the owner's own
                  jobs on a queue of root's (no: they end dead, saying so)

Only the settings someone set are stored; the rest take the built-in values
above. The first five are the queue's level of a job's policy (see
`jobs.policy`); managers take `lease` and `retention` when they start, unless
told otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from jobs.errors import InvalidJob
from jobs.retry import DEFAULT_BACKOFF, Backoff
from jobs.units import MAX_DURATION, MAX_SIZE, parse_duration, parse_size

DEFAULT_OUTPUT_LIMIT = 8 << 20  # a run's output beyond this costs disk and tells little: head and tail

BUILT_IN: dict[str, Any] = {
    "max_attempts": 3,
    "timeout": None,
    "memory_limit": None,
    "output_limit": DEFAULT_OUTPUT_LIMIT,
    "backoff": str(DEFAULT_BACKOFF),
    "lease": 30.0,
    "retention": None,
    "root_jobs": False,
}
"""Every setting's value where `queue.json` sets none: the one home of these defaults."""
SETTINGS = tuple(BUILT_IN)
TMP_AGE = 3600.0  # a submission left in tmp/ (or incoming/) this long was abandoned by its writer
NONE_WORDS = ("none", "null", "never", "off")


def _attempts(value: Any) -> int:
    number = int(value) if isinstance(value, str) and value.strip().isdigit() else value
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 1_000_000:
        raise InvalidJob(f"max_attempts must be a whole number of at least 1 (and at most 1000000), got {value!r:.40}")
    return number


def _is_none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in NONE_WORDS)


def _seconds(value: Any, *, optional: bool) -> float | None:
    if optional and _is_none(value):
        return None
    if isinstance(value, str):
        try:
            value = parse_duration(value)
        except ValueError as exc:
            raise InvalidJob(str(exc)) from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise InvalidJob(f"must be a duration greater than 0{' or none' if optional else ''}, got {value!r:.40}")
    if value > MAX_DURATION:
        raise InvalidJob(f"must be at most 100 years, got {value!r:.40}")
    return float(value)


def _bytes(value: Any) -> int | None:
    if _is_none(value):
        return None
    if isinstance(value, str):
        try:
            value = parse_size(value)
        except ValueError as exc:
            raise InvalidJob(str(exc)) from None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE:
        raise InvalidJob(f"must be a size such as 512M, or none, got {value!r:.40}")
    return value


def _yes_or_no(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    words = {"yes": True, "true": True, "on": True, "no": False, "false": False, "off": False}
    if isinstance(value, str) and value.strip().lower() in words:
        return words[value.strip().lower()]
    raise InvalidJob(f"must be yes or no, got {value!r:.40}")


def _backoff(value: Any) -> str:
    return str(Backoff.parse(value))


_CHECKS: dict[str, Callable[[Any], Any]] = {
    "max_attempts": _attempts,
    "timeout": lambda value: _seconds(value, optional=True),
    "memory_limit": _bytes,
    "output_limit": _bytes,
    "backoff": _backoff,
    "lease": lambda value: _seconds(value, optional=False),
    "retention": lambda value: _seconds(value, optional=True),
    "root_jobs": _yes_or_no,
}


def check_key(key: str) -> Callable[[Any], Any]:
    """The check of setting `key`; raise InvalidJob naming the settings if there is no such one."""
    check = _CHECKS.get(key)
    if check is None:
        raise InvalidJob(f"{key!r} is not a queue setting; the settings are: {', '.join(SETTINGS)}")
    return check


def checked(key: str, value: Any) -> Any:
    """`value` for setting `key`, converted from text where needed; raise InvalidJob if it does not fit."""
    check = check_key(key)
    try:
        return check(value)
    except InvalidJob as exc:
        message = str(exc)
        raise InvalidJob(message if message.startswith(key) else f"{key} {message}") from None


def stored(document: dict[str, Any]) -> dict[str, Any]:
    """The settings `queue.json` sets, checked; unknown keys are ignored (a newer forkvisor
    may add settings; this one must still open the queue) and so are nulls (not set)."""
    return {key: checked(key, value) for key, value in document.items() if key in _CHECKS and value is not None}


def effective(stored_settings: dict[str, Any]) -> dict[str, Any]:
    """Every setting: the stored value, else the built-in one."""
    return {key: stored_settings.get(key, default) for key, default in BUILT_IN.items()}
