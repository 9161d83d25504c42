"""A queue's settings, kept in `queue.json` under "defaults", and durations.

    max_attempts  attempts a job gets unless it says otherwise (3)
    timeout       seconds a job may run unless it says otherwise (none)
    lease         seconds a silent manager keeps its claims (30)
    retention     done jobs older than this many seconds are purged by sweeps (none: kept)

Jobs take `max_attempts` and `timeout` when they are enqueued (or, for a job a
shell script wrote without them, when they are read); managers take `lease`
and `retention` when they start, unless told otherwise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from jobs.errors import InvalidJob

DEFAULTS: dict[str, Any] = {"max_attempts": 3, "timeout": None, "lease": 30.0, "retention": None}
NONE_WORDS = ("none", "null", "never", "off")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str) -> float:
    """Seconds in `90`, `1.5`, `500ms`, `30s`, `5m`, `2h`, `7d`, `1w` or `1h30m`; raise ValueError."""
    cleaned = text.strip().lower()
    try:
        seconds = float(cleaned)
    except ValueError:
        parts = _PART.findall(cleaned)
        if not parts or "".join(number + unit for number, unit in parts) != cleaned:
            raise ValueError(
                f"{text!r} is not a duration: write seconds (90) or a number with a unit "
                "(500ms, 30s, 5m, 2h, 7d, 1w, 1h30m)"
            ) from None
        seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{text!r} is not a duration: it must be a finite number of seconds, at least 0")
    return seconds


def format_duration(seconds: float | None) -> str:
    """The shortest of `45s`, `5m`, `2h`, `7d` (or seconds) that is exact; `none` for None."""
    if seconds is None:
        return "none"
    for unit in ("d", "h", "m"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _attempts(value: Any) -> int:
    number = int(value) if isinstance(value, str) and value.strip().isdigit() else value
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise InvalidJob(f"max_attempts must be a whole number of at least 1, got {value!r}")
    return number


def _seconds(value: Any, *, optional: bool) -> float | None:
    if optional and (value is None or (isinstance(value, str) and value.strip().lower() in NONE_WORDS)):
        return None
    if isinstance(value, str):
        try:
            value = parse_duration(value)
        except ValueError as exc:
            raise InvalidJob(str(exc)) from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise InvalidJob(f"must be a duration greater than 0{' or none' if optional else ''}, got {value!r}")
    return float(value)


_CHECKS: dict[str, Callable[[Any], Any]] = {
    "max_attempts": _attempts,
    "timeout": lambda value: _seconds(value, optional=True),
    "lease": lambda value: _seconds(value, optional=False),
    "retention": lambda value: _seconds(value, optional=True),
}


def checked(key: str, value: Any) -> Any:
    """`value` for setting `key`, converted from text where needed; raise InvalidJob if it does not fit."""
    check = _CHECKS.get(key)
    if check is None:
        raise InvalidJob(f"{key!r} is not a queue setting; the settings are: {', '.join(DEFAULTS)}")
    try:
        return check(value)
    except InvalidJob as exc:
        message = str(exc)
        raise InvalidJob(message if message.startswith(key) else f"{key} {message}") from None


def merged(stored: dict[str, Any]) -> dict[str, Any]:
    """The effective settings: stored values over the defaults, unknown keys ignored
    (a newer forkvisor may add settings; this one must still open the queue)."""
    return {key: stored.get(key, default) for key, default in DEFAULTS.items()}
